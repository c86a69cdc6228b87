"""The rendezvous store listens on the address it is given, not on every interface (the two-host version, with a
second interface and a training job: tests/multinode/test_bound_rendezvous.py); torchrun hands the worker its flags."""

from __future__ import annotations

import socket
from dataclasses import fields
from datetime import timedelta
from pathlib import Path

import pytest

from ntp.config import TrainConfig
from ntp.options import literal_choices
from ntp.run.flags import config_from_args, config_to_argv
from ntp.run.launch import torchrun_command
from ntp.run.rendezvous import bound_store, torchrun_args
from ntp.run.worker import build_parser
from ntp.spec import resolve


def _listening(port: int) -> list[str]:
    """Local addresses (hex, as the kernel writes them) of the sockets listening on ``port`` in this namespace."""
    found = []
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/self/net/{table}").read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, port_hex = local.split(":")
            if state == "0A" and int(port_hex, 16) == port:  # 0A: LISTEN
                found.append(address)
    return found


def test_the_store_listens_on_the_named_address_only_and_serves_clients() -> None:
    server = bound_store("127.0.0.1", 0, is_server=True, timeout=timedelta(seconds=10))
    assert _listening(server.port) == [socket.inet_aton("127.0.0.1")[::-1].hex().upper()], "127.0.0.1, nothing else"
    client = bound_store("127.0.0.1", server.port, is_server=False, timeout=timedelta(seconds=10))
    client.set("k", "v")
    assert server.get("k") == b"v"


@pytest.mark.parametrize(
    "host, message",
    [
        ("0.0.0.0", "means every interface"),
        ("192.0.2.1", "this node must own the address"),  # TEST-NET-1: never an address of this machine
    ],
)
def test_a_store_that_cannot_be_bound_as_asked_is_refused_with_the_fix(host: str, message: str) -> None:
    with pytest.raises((ValueError, RuntimeError), match=message):
        bound_store(host, 0, is_server=True, timeout=timedelta(seconds=5))


def test_torchrun_hands_the_worker_its_flags_even_those_that_abbreviate_its_own() -> None:
    """torchrun's parser refuses a flag after the program that abbreviates two of its options (``--monitor``:
    ``--monitor-interval`` and ``--monitor_interval``); after ``--`` every flag reaches the worker untouched."""
    cfg = TrainConfig(monitor="loss", patience=5, epochs=7)
    spec = resolve(cfg, nproc=2, device="cpu")
    cmd = torchrun_command(spec)
    options = cmd[cmd.index("ntp.run.rendezvous") + 1 :]
    args = torchrun_args(options)
    assert args.module and args.training_script == "ntp.run.worker" and args.nproc_per_node == "2"
    assert args.training_script_args == ["--device", "cpu", *config_to_argv(spec.config)]
    assert "--monitor" in args.training_script_args
    with pytest.raises(SystemExit):  # torchrun's own form: its parser reads the worker's flags
        torchrun_args([arg for arg in options if arg != "--"])


#: values the general rule below does not give a field, and the fields that a field needs beside it
VALUES = {"memory_budget": "8GB", "min_lr": 0.001, "splits": "0,1"}
COUPLED_RGCN = {"model": "rgcn", "arch": "coupled"}
NEEDS = {
    "resume": {"checkpoint_dir": "ckpt"},
    "resume_anyway": {"resume": True, "checkpoint_dir": "ckpt"},
    "decomposition": {**COUPLED_RGCN, "num_bases": 2},
    "num_bases": {**COUPLED_RGCN, "decomposition": "basis"},
    "sparse_embeddings": {"model": "rgcn"},
    "nn_block_rows": {"nn_device": "stream"},
    **{name: {"arch": "coupled"} for name in ("residual", "jk", "input_proj")},
}


def _another(f, default):
    """A value of field ``f`` other than its default, as its flag takes it."""
    if f.name in VALUES:
        return VALUES[f.name]
    choices = literal_choices(f.type)
    if choices:
        return next(c for c in choices if c != default)
    if f.type == "bool":
        return not default
    if f.type.startswith("int"):
        return (default or 0) + 3
    if f.type.startswith("float"):
        return (default or 0.0) + 0.25
    return "given"


@pytest.mark.parametrize("field", [f for f in fields(TrainConfig)], ids=lambda f: f.name)
def test_every_training_flag_reaches_the_worker_through_torchrun(field) -> None:
    """Each config field, set apart from its default, travels the launch as it does on several ranks: into the
    torchrun command (config_to_argv), through torchrun's parser, into the worker's parser, back to the config."""
    value = _another(field, getattr(TrainConfig(), field.name))
    cfg = TrainConfig.from_dict({**NEEDS.get(field.name, {}), field.name: value})
    options = ["--nproc-per-node=3", "--max-restarts=0", "--standalone"]
    args = torchrun_args([*options, "--", "-m", "ntp.run.worker", "--device", "cpu", *config_to_argv(cfg)])
    assert config_from_args(build_parser().parse_args(args.training_script_args)) == cfg
