"""The results contract: typed records round-trip through the results file, the console shows each epoch, a
follower delivers records as they are written, and a progress bar draws under the streamed output."""

from __future__ import annotations

import io
import json

from ntp.engine.train.sinks import ConsoleSink, JsonlSink, epoch_line, format_duration
from ntp.records import EpochRecord, FinalRecord, WorkerStats, from_dict, read_results, to_json
from ntp.run.progress import ProgressBar
from ntp.run.tracking.live import ResultsFollower


def _epoch(epoch: int, valid: float | None = None) -> EpochRecord:
    worker = WorkerStats(
        rank=0,
        compute_s=0.5,
        comm_s={"split": 0.1},
        bytes_sent={"split": 10},
        bytes_recv={"split": 10},
        peak_mem_bytes=7,
        peak_mem_by_phase={"nn": 7},
    )
    return EpochRecord(
        epoch=epoch,
        loss=1.0 / (epoch + 1),
        epoch_s=0.25,
        train_metric=valid,
        valid_metric=valid,
        test_metric=valid,
        workers=[worker],
    )


FINAL = FinalRecord(best_epoch=1, best_valid_metric=0.75, test_metric=0.7, metric="acc", world_size=1, epochs_run=3)


def test_records_round_trip_and_ignore_unknown_keys() -> None:
    rec = _epoch(2, 0.5)
    assert from_dict(json.loads(to_json(rec))) == rec
    assert from_dict(json.loads(to_json(FINAL))) == FINAL
    newer = {**json.loads(to_json(rec)), "from_a_newer_version": 1}
    assert from_dict(newer) == rec


def test_jsonl_sink_writes_history_then_records(tmp_path) -> None:
    sink = JsonlSink(tmp_path / "r.jsonl")
    sink.start([_epoch(0)])  # a resumed run replays what its checkpoint holds
    sink.write(_epoch(1, 0.6))
    sink.write(FINAL)
    sink.close()
    res = read_results(tmp_path / "r.jsonl")
    assert [e.epoch for e in res.epochs] == [0, 1] and res.final == FINAL and res.world_size == 1


def test_console_prints_one_line_per_epoch_with_eta_and_the_final_metric() -> None:
    out = io.StringIO()
    sink = ConsoleSink(epochs=3, stream=out)
    sink.start([])
    for rec in (_epoch(0), _epoch(1, 0.75), _epoch(2)):
        sink.write(rec)
    sink.write(FINAL)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("epoch 1/3  loss 1.0000  0.250 s/epoch  ETA ")
    assert "train 0.7500  valid 0.7500  test 0.7500" in lines[1]
    assert lines[2].endswith("ETA 0:00:00")
    assert "compute max (s)" in lines[3] and "test acc 0.7000" in lines[-1] and "epoch 2" in lines[-1]
    assert epoch_line(_epoch(9), 100, 3725.0).endswith("ETA 1:02:05") and format_duration(59.6) == "0:01:00"


def test_follower_delivers_complete_lines_only_and_restarts_on_rewrite(tmp_path) -> None:
    path = tmp_path / "r.jsonl"
    seen: list = []
    follower = ResultsFollower(path, [seen.extend], interval_s=3600)
    follower.poll()  # no file yet
    with open(path, "w") as f:
        f.write(to_json(_epoch(0)) + "\n" + to_json(_epoch(1))[:20])  # the second line is half written
    follower.poll()
    assert [r.epoch for r in seen] == [0]
    with open(path, "a") as f:
        f.write(to_json(_epoch(1))[20:] + "\n")
    follower.poll()
    assert [r.epoch for r in seen] == [0, 1]
    path.write_text(to_json(_epoch(0)) + "\n")  # rewritten shorter (a resume replays its history)
    follower.poll()
    assert [r.epoch for r in seen] == [0, 1, 0]


def test_a_failing_consumer_is_reported_once_and_never_stops_the_others(tmp_path) -> None:
    path = tmp_path / "r.jsonl"
    warnings, seen = [], []

    def broken(_records) -> None:
        raise ConnectionError("tracking server down")

    follower = ResultsFollower(path, [broken, seen.extend], interval_s=0.01, warn=warnings.append)
    with follower:
        path.write_text(to_json(_epoch(0)) + "\n")
    with open(path, "a") as f:
        f.write(to_json(_epoch(1)) + "\n")
    follower.poll()
    assert [r.epoch for r in seen] == [0, 1]
    assert len(warnings) == 1 and "tracking server down" in warnings[0]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_draws_under_the_output_of_an_interactive_terminal() -> None:
    assert not ProgressBar.wanted(io.StringIO()) and ProgressBar.wanted(_Terminal())
    term = _Terminal()
    bar = ProgressBar(total_epochs=4, stream=term)
    bar([_epoch(0)])
    bar.line("a worker line")
    bar([_epoch(1), _epoch(2)])
    bar.close()
    screen = term.getvalue()
    assert "[#######-----------------------] 1/4 epochs  loss 1.0000" in screen
    assert "\r\x1b[2Ka worker line\n" in screen
    assert "3/4 epochs  loss 0.3333  ETA " in screen
    assert screen.endswith("\r\x1b[2K"), "closing clears the bar"
