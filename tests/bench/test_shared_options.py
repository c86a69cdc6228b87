"""Each bench script offers only the shared options (--quick, --repeats, --threads) that it reads: an option a script
takes and ignores would make a measured command mean something other than what it says."""

from __future__ import annotations

import inspect
import re
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
from common import base_parser  # noqa: E402  (bench/ is not a package)

#: bench/common.py helpers that read shared options for the script that calls them
HELPERS = {"graph_selection": {"quick"}, "single_process_settings": {"quick", "repeats", "threads"}}
#: which shared options base_parser adds when a script does not say
DEFAULTS = {
    name: param.default
    for name, param in inspect.signature(base_parser).parameters.items()
    if param.kind is inspect.Parameter.KEYWORD_ONLY
}


def _offered(call: str) -> set[str]:
    given = dict(re.findall(r"(\w+)=(True|False)", call))
    return {name for name, default in DEFAULTS.items() if given.get(name, str(default)) == "True"}


def _read(source: str) -> set[str]:
    read = set(re.findall(r"args\.(quick|repeats|threads)\b", source))
    for helper, options in HELPERS.items():
        if re.search(rf"\b{helper}\(args", source):
            read |= options
    return read


def test_every_shared_option_a_script_offers_is_read() -> None:
    scripts = {}
    for path in sorted(BENCH.glob("*.py")):
        call = re.search(r"base_parser\(__doc__[^)]*\)", path.read_text())
        if call:
            scripts[path.name] = (_offered(call.group()), _read(path.read_text()))
    assert len(scripts) > 10, "the scripts were found"
    ignored = {name: sorted(offered - read) for name, (offered, read) in scripts.items() if offered - read}
    assert not ignored, f"offered and never read: {ignored}"
