import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlanything.storage import schemas
from rlanything.storage.buffer import initial_buffer, read_buffer, sample_batch, write_buffer
from rlanything.storage.parquet import read_table, write_table

SCHEMA = pa.schema([pa.field("traj_id", pa.int32(), nullable=False), pa.field("logprobs", pa.list_(pa.float32()))])


def test_every_artifact_has_an_explicit_schema():
    names = ["ROLLOUTS", "EPISODES", "OUTCOMES", "JUDGMENTS", "ADVANTAGES", "UPDATE", "ADAPTATION", "TASKS"]
    for name in names:
        schema = getattr(schemas, name)
        assert isinstance(schema, pa.Schema) and len(schema) >= 5, name


def test_round_trip_casts_to_schema(tmp_path):
    path = write_table([{"traj_id": 3, "logprobs": [-0.5, -1.25]}], SCHEMA, tmp_path / "a.parquet")
    frame = read_table(path, SCHEMA)
    assert frame.traj_id.tolist() == [3] and list(frame.logprobs[0]) == [-0.5, -1.25]
    assert pq.read_schema(path).field("traj_id").type == pa.int32()


def test_columns_must_match(tmp_path):
    with pytest.raises(ValueError, match="extra.*oops"):
        write_table([{"traj_id": 1, "logprobs": [], "oops": 1}], SCHEMA, tmp_path / "a.parquet")
    with pytest.raises(ValueError, match="missing.*logprobs"):
        write_table(__import__("pandas").DataFrame({"traj_id": [1]}), SCHEMA, tmp_path / "b.parquet")
    assert not list(tmp_path.iterdir())


def test_read_rejects_a_foreign_schema(tmp_path):
    other = pa.schema([pa.field("traj_id", pa.int64())])
    pq.write_table(pa.table({"traj_id": [1]}, schema=other), tmp_path / "x.parquet")
    with pytest.raises(ValueError, match="schema mismatch"):
        read_table(tmp_path / "x.parquet", SCHEMA)


def test_interrupted_write_leaves_no_partial_file(tmp_path, monkeypatch):
    real = pq.write_table

    def write_half_then_die(table, where, **kw):
        real(table.slice(0, 1), where, **kw)  # bytes hit the disk...
        raise KeyboardInterrupt  # ...then the process is interrupted before the rename

    monkeypatch.setattr(pq, "write_table", write_half_then_die)
    target = tmp_path / "rollouts.parquet"
    with pytest.raises(KeyboardInterrupt):
        write_table([{"traj_id": i, "logprobs": [0.0]} for i in range(3)], SCHEMA, target)
    assert list(tmp_path.iterdir()) == []  # neither the target nor a temp file


def test_interrupted_overwrite_keeps_the_old_file(tmp_path, monkeypatch):
    target = write_table([{"traj_id": 1, "logprobs": [0.0]}], SCHEMA, tmp_path / "a.parquet")
    monkeypatch.setattr(pq, "write_table", lambda *a, **k: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError):
        write_table([{"traj_id": 2, "logprobs": [0.0]}], SCHEMA, target)
    assert read_table(target, SCHEMA).traj_id.tolist() == [1]
    assert [p.name for p in tmp_path.iterdir()] == ["a.parquet"]


def test_buffer_sampling_is_seeded_and_takes_pending(tmp_path):
    buffer = initial_buffer([{"seed": i} for i in range(10)])
    buffer.loc[buffer.slot == 9, "status"] = "pending"
    path = write_buffer(buffer, tmp_path / "v0000.parquet")
    again = read_buffer(path)
    first, second = sample_batch(again, 4, seed=7), sample_batch(again, 4, seed=7)
    assert first == second
    assert sample_batch(again, 4, seed=8) != first
    regular = [t for t in first if not t["pending"]]
    assert len(regular) == 4 and all(t["slot"] != 9 for t in regular)
    assert [t["task_id"] for t in first if t["pending"]] == ["s0009v00"]
    assert len(sample_batch(again, 100, seed=1)) == 10  # all 9 active + the pending one


# ---------------------------------------------------------------- atomic small files and named artifacts


def test_write_text_replaces_atomically_and_leaves_no_temp_file(tmp_path):
    from rlanything.storage.parquet import write_text

    path = write_text("first\n", tmp_path / "deep" / "DONE")
    write_text('{"iteration": 0}', path)
    assert path.read_text() == '{"iteration": 0}' and [p.name for p in path.parent.iterdir()] == ["DONE"]


def test_a_failed_atomic_write_keeps_the_old_file(tmp_path):
    from rlanything.storage.parquet import atomic_write, write_text

    path = write_text("old", tmp_path / "summary.md")

    def half_then_fail(tmp):
        tmp.write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write(path, half_then_fail)
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["summary.md"]


def test_artifacts_are_read_and_written_by_name_with_their_schema(tmp_path):
    from rlanything.storage.artifacts import artifact_rows, read_artifact, write_artifact
    from rlanything.storage.layout import RunLayout

    layout = RunLayout(tmp_path)
    row = {
        "update_idx": 0,
        "epoch": 0,
        "num_samples": 2,
        "num_tokens": 9,
        "loss": 0.5,
        "pg_loss": 0.4,
        "kl": 0.0,
        "anchor_kl": None,  # no anchor KL (optim.anchor_beta 0)
        "clip_frac": 0.0,
        "entropy": 2.5,
        "grad_norm": 1.0,
        "lr": 1e-5,
        "mismatch_abs_mean": None,  # old log-probs not recomputed
        "mismatch_abs_max": None,
        "mismatch_outside_cap": None,
    }
    path = write_artifact([row], layout, 3, "rm_update")
    assert path == tmp_path / "iter_0003" / "rm_update.parquet"
    assert read_artifact(layout, 3, "rm_update").num_tokens.tolist() == [9]
    assert artifact_rows(layout, 3, "rm_update") == 1
    with pytest.raises(ValueError, match="unknown artifact 'rollout'"):
        read_artifact(layout, 3, "rollout")
    with pytest.raises(ValueError, match="schema mismatch"):  # an artifact written with another schema
        write_table([{"traj_id": 1}], pa.schema([pa.field("traj_id", pa.int32())]), layout.artifact(3, "outcomes"))
        read_artifact(layout, 3, "outcomes")


def test_a_file_of_an_earlier_version_without_the_later_columns_reads_with_them_null(tmp_path):
    """judgments.parquet before December 7 had neither unchosen_logprobs nor p_plus
    (schemas.LATER_COLUMNS): it reads with both null, so older runs resume and re-judge; a file
    that lacks any other column, or has a later column of another type, is still refused."""
    from rlanything.storage.schemas import JUDGMENTS, LATER_COLUMNS

    row = {
        "traj_id": 0, "task_id": "t", "step_idx": 1, "judge_idx": 2, "verdict_mode": "constrained",
        "prompt": "p", "reasoning": "r", "raw_box": "1", "step_score": 1, "parsed": True,
        "prompt_ids": [1, 2], "response_ids": [3], "logprobs": [-0.5], "weights": "w",
    }  # fmt: skip
    older = pa.schema([f for f in JUDGMENTS if f.name not in LATER_COLUMNS])
    pq.write_table(pa.Table.from_pylist([row], schema=older), tmp_path / "old.parquet")
    frame = read_table(tmp_path / "old.parquet", JUDGMENTS)
    assert list(frame.columns) == JUDGMENTS.names
    assert frame.unchosen_logprobs[0] is None and frame.p_plus.isna().all() and frame.logprobs[0].tolist() == [-0.5]
    no_weights = pa.schema([f for f in older if f.name != "weights"])
    pq.write_table(pa.Table.from_pylist([row], schema=no_weights), tmp_path / "bad.parquet")
    with pytest.raises(ValueError, match="schema mismatch"):
        read_table(tmp_path / "bad.parquet", JUDGMENTS)
    odd = older.append(pa.field("p_plus", pa.string()))  # a later column, but not as declared
    pq.write_table(pa.Table.from_pylist([row | {"p_plus": "x"}], schema=odd), tmp_path / "odd.parquet")
    with pytest.raises(ValueError, match="schema mismatch"):
        read_table(tmp_path / "odd.parquet", JUDGMENTS)
