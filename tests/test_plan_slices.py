"""Plans made a slice at a time, to bound their memory at a million records, are the
plans made at once: shared starts encoded, nodes merged and records measured a few at a
time; and the cycle collector, off while planning."""

from __future__ import annotations

import polars as pl
import pytest

from nightshift.scheduling.plan import build_plan, load_encoder

from .questions import questions_spec


def test_shared_starts_encoded_a_slice_at_a_time_give_the_same_plan(
    models, questions_input, tmp_path, monkeypatch
):
    """The nodes' shared starts are encoded ENCODE_BATCH at a time, to keep their token
    ids from piling up at a million records; slices of two give the very same plan."""
    from nightshift.scheduling import prefixes

    spec = questions_spec(models, questions_input, tmp_path / "out")
    encoder = load_encoder(spec)
    whole = build_plan(spec, encoder, progress=False)
    monkeypatch.setattr(prefixes, "ENCODE_BATCH", 2)
    sliced = build_plan(spec, encoder, progress=False)
    assert sliced.records.equals(whole.records)
    assert sliced.prefix_reuse == whole.prefix_reuse
    assert whole.prefix_reuse["shared_start_tokens"] > 0


def test_nodes_merged_a_few_records_at_a_time_are_those_of_one_batch(
    models, questions_input, tmp_path, monkeypatch
):
    """Each node's members, smallest and largest next chunk and first member (input
    order) are merged read batch by read batch; the first members are read again for
    the shared starts. Two records at a time, the nodes and the plan are those of one
    batch."""
    from nightshift.scheduling import prefixes
    from nightshift.scheduling.chunkkeys import ChunkKeys
    from nightshift.scheduling.firstpass import measure_input
    from nightshift.scheduling.kvcache import block_size
    from nightshift.scheduling.measure import RecordMeasurer
    from nightshift.scheduling.plan import open_job_input
    from nightshift.scheduling.sharing import depth_of

    spec = questions_spec(models, questions_input, tmp_path / "out")
    encoder, block = load_encoder(spec), block_size(spec)
    dataset, columns = open_job_input(spec)
    measurer = RecordMeasurer(spec, encoder, block)
    with ChunkKeys() as chunks:
        keys = measure_input(dataset, columns, measurer, False, None, chunks)
        runnable = keys.with_columns(depth_of(chunks, keys["_seq"].to_numpy()))

    def nodes() -> pl.DataFrame:
        return prefixes._next_chunks(dataset, measurer, runnable).sort("node")

    whole, plan = nodes(), build_plan(spec, encoder, progress=False)
    monkeypatch.setattr(prefixes, "READ_BATCH", 2)
    assert nodes().equals(whole)
    # merged as soon as as many rows wait as are merged (once per doubling of the nodes)
    batches, merges, merge = [], [], prefixes._merged
    monkeypatch.setattr(prefixes, "MERGE_AT_LEAST", 1)
    monkeypatch.setattr(prefixes, "_merged", lambda ends: merges.append(1) or merge(ends))
    chunk_ends = prefixes._chunk_ends
    monkeypatch.setattr(prefixes, "_chunk_ends", lambda *a: batches.append(1) or chunk_ends(*a))
    assert nodes().equals(whole)
    assert len(merges) - len(batches) >= 3  # each batch's own, then several of the nodes
    shuffled = runnable.sample(fraction=1.0, shuffle=True, seed=3)
    assert prefixes._next_chunks(dataset, measurer, shuffled).sort("node").equals(whole)
    assert whole["members"].sum() == (runnable["depth"] > 0).sum()
    assert (whole["members"] > 1).any() and (whole["lowest"] != whole["highest"]).any()
    # each member's next chunk, from all the records at once
    records = pl.concat([pl.read_parquet(f) for f in dataset.files])
    sharing = runnable.with_row_index("_at").filter(pl.col("depth") > 0)
    each = prefixes._chunk_ends(measurer, records[sharing["_at"]], sharing)
    ends = each.group_by("node").agg(pl.col("lowest").min(), pl.col("highest").max(), pl.len())
    assert whole.select("node", "lowest", "highest").equals(ends.sort("node").drop("len"))
    members = runnable.filter(pl.col("depth") > 0).sort("_file", "_row")
    first = members.group_by("node", maintain_order=True).first().sort("node")
    assert whole.select("node", "_file", "_row").equals(first.select("node", "_file", "_row"))
    small = build_plan(spec, encoder, progress=False)
    assert small.records.equals(plan.records)
    assert small.prefix_reuse == plan.prefix_reuse


def test_records_measured_a_few_at_a_time_give_the_same_plan(
    models, questions_input, tmp_path, monkeypatch
):
    """Records are measured MEASURE_BATCH at a time once the token estimate is
    calibrated; until then a read batch is measured whole, so the estimate is calibrated
    on the same records (its first 2,000) whatever MEASURE_BATCH is."""
    from nightshift.scheduling import firstpass

    spec = questions_spec(models, questions_input, tmp_path / "out")
    encoder = load_encoder(spec)
    whole = build_plan(spec, encoder, progress=False)
    monkeypatch.setattr(firstpass, "MEASURE_BATCH", 3)
    small = build_plan(spec, encoder, progress=False)
    assert small.exact_records == whole.exact_records > 3
    assert small.records.equals(whole.records)
    assert small.rejects.equals(whole.rejects)


def test_the_cycle_collector_is_off_while_planning_and_as_it_was_after(
    models, questions_input, tmp_path, monkeypatch
):
    """A plan of a million records made 17 full collections that found nothing; it runs
    with the collector off, and leaves it as it found it, a failed plan too."""
    import gc

    from nightshift.scheduling import plan as planning

    spec = questions_spec(models, questions_input, tmp_path / "out")
    encoder = load_encoder(spec)
    seen = []
    measure = planning.measure_input

    def watched(*args, **kwargs):
        seen.append(gc.isenabled())
        return measure(*args, **kwargs)

    monkeypatch.setattr(planning, "measure_input", watched)
    assert gc.isenabled()
    build_plan(spec, encoder, progress=False)
    assert seen == [False] and gc.isenabled()

    def broken(*args, **kwargs):
        raise OSError("input gone")

    monkeypatch.setattr(planning, "measure_input", broken)
    with pytest.raises(OSError):
        build_plan(spec, encoder, progress=False)
    assert gc.isenabled()
    gc.disable()
    try:
        monkeypatch.setattr(planning, "measure_input", watched)
        build_plan(spec, encoder, progress=False)
        assert not gc.isenabled()  # the caller's choice stands
    finally:
        gc.enable()


def test_passes_after_the_first_read_only_the_prompts_columns(
    models, questions_input, tmp_path, monkeypatch
):
    """The node passes read again only what a prompt is made from: kept and eval
    columns (a wide body kept for the results, say) are read once, by the first pass."""
    from nightshift.scheduling import prefixes

    records = pl.concat([pl.read_parquet(f) for f in sorted(questions_input.glob("*.parquet"))])
    wide = records.with_columns(pl.lit("x" * 2000).alias("notes"))
    wide.write_parquet(questions_input / "a.parquet")
    (questions_input / "b.parquet").unlink()
    read = []
    batches = prefixes.file_batches

    def watched(dataset, index, columns, rows):
        read.append(list(columns))
        return batches(dataset, index, columns, rows)

    monkeypatch.setattr(prefixes, "file_batches", watched)
    spec = questions_spec(models, questions_input, tmp_path / "out")
    spec.input.keep_columns = ["notes"]
    plan = build_plan(spec, load_encoder(spec), progress=False)
    assert read and all(sorted(columns) == ["document", "question"] for columns in read)
    assert plan.prefix_reuse["shared_start_tokens"] > 0
