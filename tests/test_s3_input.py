"""Input Parquet on S3: a real S3 server on loopback (moto's server mode)."""

from __future__ import annotations

import io
import urllib.request

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from nightshift.engines.fake import FakeEngine
from nightshift.jobs.loading import validate_spec
from nightshift.pipelines.direct import run_job

from .conftest import spec_dict


@pytest.fixture
def s3(monkeypatch):
    """A bucket on a loopback S3 server; the AWS environment points at it."""
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    # moto keeps its buckets per process, not per server: start and end empty, so one
    # test's objects never show up in another's listing (xdist runs several here).
    reset = f"http://{host}:{port}/moto-api/reset"
    urllib.request.urlopen(urllib.request.Request(reset, method="POST")).close()
    for key, value in {
        "AWS_ENDPOINT_URL": f"http://{host}:{port}",
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(key, value)
    client = boto3.client("s3")
    client.create_bucket(Bucket="tickets")
    yield client
    urllib.request.urlopen(urllib.request.Request(reset, method="POST")).close()
    server.stop()


def upload(client, key: str, rows: list[dict]) -> None:
    buffer = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buffer)
    client.put_object(Bucket="tickets", Key=key, Body=buffer.getvalue())


@pytest.mark.parametrize(
    "path", ["s3://tickets/in/*.parquet", "s3://tickets/in", "s3://tickets/in/b.parquet"]
)
def test_job_reads_input_from_s3(s3, models, tmp_path, path):
    rows = [{"ticket_id": f"t{i}", "subject": "s", "body": f"body {i}"} for i in range(30)]
    upload(s3, "in/a.parquet", rows[:10])
    upload(s3, "in/b.parquet", rows[10:])
    upload(s3, "other/c.parquet", rows[:5])  # outside the prefix: never read
    spec = validate_spec(spec_dict(models["chat"], path, tmp_path / "out"))
    outcome = run_job(spec, engine=FakeEngine(), progress=False)
    expected = 20 if path.endswith("b.parquet") else 30
    assert outcome.report["records"]["ok"] == expected
    ids = pl.read_parquet(tmp_path / "out" / "results" / "*.parquet")["ticket_id"]
    assert ids.n_unique() == expected


def test_missing_s3_prefix_names_the_key(s3, models, tmp_path):
    from nightshift.errors import SpecError

    spec = validate_spec(spec_dict(models["chat"], "s3://tickets/none/*.parquet", tmp_path / "o"))
    with pytest.raises(SpecError, match="matches no Parquet files") as caught:
        run_job(spec, engine=FakeEngine(), progress=False)
    assert caught.value.key == "input.path"


@pytest.mark.parametrize(
    ("path", "exclude", "kept"),
    [
        ("s3://b/data", "s3://b/data/out", ["b/data/a.parquet", "b/data/outgoing/c.parquet"]),
        ("s3://b/data", "s3://b/data/out/", ["b/data/a.parquet", "b/data/outgoing/c.parquet"]),
        ("s3://b/data", "s3://other/data/out", None),  # another bucket: nothing is excluded
        ("s3://b/data", "/tmp/b/data/out", None),  # a local output: nothing is excluded
        ("s3://b/data", None, None),
    ],
)
def test_the_output_prefix_is_left_out_of_an_s3_input(path, exclude, kept):
    from nightshift.io.inputs import outside

    files = [
        "b/data/a.parquet",
        "b/data/out/results/shard-00000-x.parquet",
        "b/data/out/plan/shards/shard-00000.parquet",
        "b/data/outgoing/c.parquet",
    ]
    assert outside(files, path, exclude) == (files if kept is None else kept)


def test_the_output_directory_is_left_out_of_a_local_input(tmp_path):
    from nightshift.io.inputs import outside

    files = [str(tmp_path / n) for n in ("a.parquet", "out/r.parquet", "outgoing/c.parquet")]
    kept = [files[0], files[2]]
    assert outside(files, str(tmp_path), str(tmp_path / "out")) == kept
    assert outside(files, str(tmp_path), str(tmp_path / "out") + "/") == kept
    assert outside(files, str(tmp_path), "s3://b/out") == files


def test_a_job_whose_output_is_under_its_s3_input_runs_night_after_night(s3, models):
    """The output sits inside the input prefix: its own Parquet files are never input."""
    rows = [{"ticket_id": f"t{i}", "subject": "s", "body": f"body {i}"} for i in range(12)]
    upload(s3, "data/a.parquet", rows[:8])
    upload(s3, "data/outgoing/c.parquet", rows[8:])  # shares the output's name's start
    spec = validate_spec(spec_dict(models["chat"], "s3://tickets/data", "s3://tickets/data/out"))
    first = run_job(spec, engine=FakeEngine(), progress=False)
    assert first.report["records"]["ok"] == 12
    upload(s3, "data/b.parquet", [{"ticket_id": "t99", "subject": "s", "body": "new"}])
    second = run_job(spec, engine=FakeEngine(), progress=False)
    assert second.report["this_run"]["records_answered"] == 1
    assert second.report["records"]["input"] == 13
    third = run_job(spec, engine=FakeEngine(), progress=False)
    assert third.report["this_run"]["records_answered"] == 0
