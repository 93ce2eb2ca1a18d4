"""Which key fields a table or legend shows, the sentence for the rest, the order of rows (bench.reporting.keys),
and the sweep index (bench.reporting.sweeps): each worked by hand on rows and records written here."""
from __future__ import annotations

from bench.reporting import keys, sweeps
from bench.reporting.document import Table
from common.config_key import config_key


def _row(**changes) -> dict[str, str]:
    """A row's cells as keys.cells gives them."""
    return {"backend": "torch_ddp", "host": "h1", "device_kind": "cpu", "model_size": "tiny", "precision": "fp32",
            "batch": "32 per device", "micro_batches": "1", "layout": "dp", "compile": "eager", "mode": "ddp",
            "threads_per_device": "1", "scaling": "weak", "data": "synthetic", "sweep": "a", **changes}


def test_a_field_is_shown_where_it_varies_within_a_backend_on_one_machine():
    assert keys.distinguishing([_row(), _row(backend="tf_mirrored")]) == []
    assert keys.distinguishing([_row(), _row(precision="amp"), _row(sweep="b")]) == ["precision", "sweep"]
    # varying only with the backend: said once per backend, not a column
    assert keys.distinguishing([_row(), _row(backend="tf_mirrored", precision="amp")]) == []
    # two hosts: the host is shown, and a field that follows the host is not (it varies with the machine only)
    two_hosts = [_row(), _row(host="h2", threads_per_device="2")]
    assert keys.distinguishing(two_hosts) == ["host"]
    assert keys.distinguishing(two_hosts, ("threads_per_device", "precision")) == ["threads_per_device"]
    assert keys.distinguishing([_row(), _row(device_kind="gpu", model_size="base")]) == ["device_kind"]
    # an unknown value tells nothing apart, on the machine or off it
    assert keys.distinguishing([_row(), _row(precision="?"), _row(host="?")]) == []
    assert keys.distinguishing([_row(), _row(host="?", precision="amp")]) == ["precision"]


def test_the_fields_not_shown_are_said_once_or_once_per_backend():
    rows = [_row(), _row(precision="amp"), _row(backend="tf_mirrored", data="wikitext", precision="bf16"),
            _row(backend="tf_mirrored", data="mnist", precision="bf16")]
    assert keys.said_once(rows, ["precision"], ("host", "precision", "data", "scaling")) == (
        "Same in every row: host h1, scaling weak. tf_mirrored: data mnist / wikitext. torch_ddp: data synthetic.")
    assert keys.said_once(rows, ["precision", "data"], ("precision", "data", "layout"), what="line") == \
        "Same in every line: layout dp."
    assert keys.said_once(rows, ["data"], ("precision", "data")) == \
        "tf_mirrored: precision bf16. torch_ddp: precision amp / fp32."
    assert keys.said_once(rows, [], ("precision", "data")) == (
        "tf_mirrored: precision bf16, data mnist / wikitext. torch_ddp: precision amp / fp32, data synthetic.")
    assert keys.said_once(rows, ["precision"], ("precision",)) == ""


def test_rows_sort_by_backend_then_label_fields_with_numbers_as_numbers():
    rows = [_row(batch="256 global"), _row(backend="tf_mirrored", batch="512 global"), _row(batch="32 global"),
            _row(batch="32 global", micro_batches="10"), _row(batch="32 global", micro_batches="9"),
            _row(batch="32 global", micro_batches="9", sweep="b")]
    assert [(r["backend"], r["batch"], r["micro_batches"], r["sweep"]) for r in sorted(rows, key=keys.order)] == [
        ("tf_mirrored", "512 global", "1", "a"), ("torch_ddp", "32 global", "1", "a"),
        ("torch_ddp", "32 global", "9", "a"), ("torch_ddp", "32 global", "9", "b"),
        ("torch_ddp", "32 global", "10", "a"), ("torch_ddp", "256 global", "1", "a")]
    assert keys.order(_row(batch="32 global"))[5] == ("", 32, " global")


def test_a_label_says_what_a_bare_number_counts():
    assert [keys.in_label("micro_batches", v) for v in ("1", "4")] == ["1 micro-batch", "4 micro-batches"]
    assert keys.in_label("threads_per_device", "2") == "threads/device 2"
    assert keys.in_label("layout", "tp2") == "layout tp2" and keys.in_label("sweep", "a") == "sweep a"
    assert keys.in_label("precision", "amp") == "amp" and keys.in_label("batch", "32 per device") == "32 per device"


def _record(backend="torch_ddp", precision="fp32", sweep=None, status="ok", started=None, command=None,
            workload="mlm", **fields) -> dict:
    record = {"run_id": f"{backend}-{precision}-{started}", "status": status, "workload": workload,
              "backend": backend, "devices": 1, "device_kind": "cpu", "scaling": "weak", "global_batch": 32,
              "per_device_batch": 32, "data": "synthetic", "config": {"precision": precision, "model_size": "tiny"},
              "host": {"name": "h1"}, "threads_per_device": 1, **fields}
    for name, value in (("sweep_id", sweep), ("started_at", started), ("sweep_command", command)):
        if value is not None:
            record[name] = value
    return record


def test_a_record_s_cells_and_the_labels_of_several_keys():
    assert keys.cells(_record(sweep="sweep-x1")) == {
        "workload": "mlm", "backend": "torch_ddp", "mode": keys.cells(_record())["mode"], "model_size": "tiny",
        "precision": "fp32", "scaling": "weak", "batch": "32 per device", "micro_batches": "1",
        "layout": keys.key_cells(config_key(_record()))["layout"], "compile": "eager", "data": "synthetic",
        "device_kind": "cpu", "host": "h1", "threads_per_device": "1", "sweep": "x1"}
    assert keys.cells(_record())["sweep"] == "no sweep"
    assert keys.describe_sweep("sweep-sweep-1") == "sweep-1" and keys.describe_sweep("x") == "x"
    labelled = [config_key(r) for r in (_record(), _record(precision="amp"), _record("tf_mirrored"))]
    assert keys.row_labels(labelled) == ["torch_ddp · fp32", "torch_ddp · amp", "tf_mirrored · fp32"]
    # the sweep is no part of a key's label
    assert keys.row_labels([config_key(_record(sweep="sweep-a")), config_key(_record("tf_mirrored"))]) == \
        ["torch_ddp", "tf_mirrored"]
    # the data tells keys apart too; a bare number says what it counts
    assert keys.row_labels([config_key(_record()), config_key(_record(data="wikitext"))]) == \
        ["torch_ddp · synthetic", "torch_ddp · wikitext"]
    assert keys.row_labels([config_key(_record()), config_key(_record(threads_per_device=2))]) == \
        ["torch_ddp · threads/device 1", "torch_ddp · threads/device 2"]


def test_the_sweep_index_lists_each_sweep_oldest_first_with_its_command_span_and_counts():
    records = [_record(sweep="sweep-b", started="2026-01-03T10:00:00+00:00", command="bench.compare --x"),
               _record("tf_mirrored", sweep="sweep-b", started="2026-01-02T09:30:15+00:00", status="failed",
                       workload="cnn", command=""),
               _record(sweep="sweep-b", started="2026-01-04T00:00:00+00:00", status="unsupported",
                       command="bench.compare --y"),
               _record(started="2026-01-05T00:00:00+00:00"),
               _record(status="invalid", started="2026-01-06T00:00:00+00:00"),
               _record(sweep="sweep-a", started="2026-01-01T00:00:00+00:00"),
               _record(sweep="sweep-c")]
    assert sweeps.sweep_ids(records) == ["sweep-c", "sweep-a", "sweep-b", ""]
    assert sweeps.sweep_index(records) == Table(
        ["sweep", "when (UTC)", "command", "backends", "workloads", "runs"],
        [["c", "?", "not recorded (a sweep before the field)", "torch_ddp", "mlm", "1 ok"],
         ["a", "2026-01-01 00:00:00", "not recorded (a sweep before the field)", "torch_ddp", "mlm", "1 ok"],
         ["b", "2026-01-02 09:30:15 to 2026-01-04 00:00:00", "bench.compare --x; bench.compare --y",
          "tf_mirrored, torch_ddp", "cnn, mlm", "1 ok, 1 failed, 1 unsupported"],
         ["no sweep (--sweep none)", "2026-01-05 00:00:00 to 2026-01-06 00:00:00", "bench.run, a command per run",
          "torch_ddp", "mlm", "1 ok, 1 invalid"]])


def test_a_sweep_is_selected_by_its_id_as_recorded_or_as_shown_and_none_selects_the_runs_outside():
    records = [_record(sweep="sweep-a", started="1"), _record(sweep="b", started="2"), _record(started="3"),
               _record(sweep="sweep-ab", started="4")]
    assert [r["started_at"] for r in sweeps.matching(records, "a")] == ["1"]
    assert [r["started_at"] for r in sweeps.matching(records, "sweep-a")] == ["1"]
    assert [r["started_at"] for r in sweeps.matching(records, "b")] == ["2"]
    assert [r["started_at"] for r in sweeps.matching(records, "none")] == ["3"]
