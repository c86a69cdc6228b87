#!/usr/bin/env bash
# Pack what a lent GPU machine lacks into .device/ (git-ignored; name it in the device tool's `carry`):
#   .device/wheels    zarr and ogb with their missing dependencies, for the machine's Python 3.12 (x86-64)
#   .device/datasets  the real graphs the GPU benchmarks read (ogbl-ddi, Cora, CiteSeer, Amazon Photo), ~30 MB
# There, bench/on_device.sh installs the wheels and points the benchmarks at these datasets.
# Run it here, once, from the repository root: bash bench/device_kit.sh
set -euo pipefail
cd "$(dirname "$0")/.."
shared="${NTP_DATASETS:-../shared/datasets}"
rm -rf .device && mkdir -p .device/wheels .device/datasets/ogb-layout .device/datasets/ogb-link/ogbl-ddi/split/target

platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$p")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}" \
  -d .device/wheels "zarr>=3.1,<3.2" numcodecs donfig google-crc32c ogb==1.3.6 outdated littleutils

for name in cora citeseer amazon-photo; do
  cp -r "$shared/ogb-layout/$name" .device/datasets/ogb-layout/
done
ddi="$shared/ogb-link/ogbl-ddi"
cp -r "$ddi/raw" "$ddi/RELEASE_v1.txt" .device/datasets/ogb-link/ogbl-ddi/
cp "$ddi"/split/target/*.pt .device/datasets/ogb-link/ogbl-ddi/split/target/  # the .npz copies are for tests
chmod -R u+w .device
du -sh .device
