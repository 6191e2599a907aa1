"""The object-store contract, on a local directory and on a real S3 server (SeaweedFS).

The same tests run against both backends, since job code must not care which it has.
The S3 ones also go through a proxy that fails requests on purpose, to show the retries
work rather than assume they do.
"""

from __future__ import annotations

import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import polars as pl
import pytest

from nightshift.errors import ObjectNotFound, StoreAccessError, StoreError
from nightshift.io import s3store
from nightshift.io.objectstore import TEMP_PREFIX, LocalStore, ObjectStore, open_store

from .faultproxy import FAULT_KINDS

pytest_plugins = ["tests.s3server"]

MULTIPART = 9 * 1024 * 1024  # over boto3's 8 MiB threshold: a two-part upload


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path) -> ObjectStore:
    """A fresh, empty store: a temp directory, or a unique prefix in the test bucket."""
    if request.param == "local":
        return open_store(str(tmp_path / "store"))
    server = request.getfixturevalue("s3_env")
    return open_store(fresh_location(server.bucket))


def fresh_location(bucket: str) -> str:
    return f"s3://{bucket}/t-{uuid.uuid4().hex[:12]}"


def through(proxy, monkeypatch, location: str) -> ObjectStore:
    """A store at ``location`` whose client talks to the fault proxy."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
    return open_store(location)


@pytest.fixture
def fast_backoff(monkeypatch):
    """Retry after 10 ms instead of botocore's up-to-1-2-4 s: these tests count, not wait."""
    from botocore.retries import standard

    monkeypatch.setattr(standard.ExponentialBackoff, "delay_amount", lambda self, ctx: 0.01)
    monkeypatch.setattr(s3store, "_backoff", lambda attempt: 0.01)


# --- the contract, on both backends -----------------------------------------------------


def test_round_trip_and_overwrite(store):
    assert isinstance(store, ObjectStore)
    assert store.uri("a/b.bin") == store.root + "/a/b.bin"
    assert not store.exists("a/b.bin")
    store.put_bytes("a/b.bin", bytes(range(256)))
    assert store.exists("a/b.bin")
    assert store.get_bytes("a/b.bin") == bytes(range(256))
    store.put_bytes("a/b.bin", b"second")
    assert store.get_bytes("a/b.bin") == b"second"
    store.put_bytes("empty", b"")
    assert store.get_bytes("empty") == b""


def test_list_is_sorted_relative_and_by_prefix(store):
    for key in ["b/c/d", "a/2", "ab", "a/1"]:
        store.put_bytes(key, key.encode())
    assert store.list("") == ["a/1", "a/2", "ab", "b/c/d"]
    assert store.list("a/") == ["a/1", "a/2"]
    assert store.list("a") == ["a/1", "a/2", "ab"]
    assert store.list("b/c") == ["b/c/d"]
    assert store.list("zz/") == []


def test_store_sees_only_its_own_root(store):
    sibling = open_store(store.root + "-sibling")
    sibling.put_bytes("x", b"1")
    store.put_bytes("y", b"2")
    assert store.list("") == ["y"]
    assert not store.exists("x")


def test_missing_key_raises_object_not_found(store, tmp_path):
    with pytest.raises(ObjectNotFound, match="nope"):
        store.get_bytes("nope")
    with pytest.raises(ObjectNotFound, match="dir/nope"):
        store.download("dir/nope", tmp_path / "out" / "x")
    assert not (tmp_path / "out" / "x").exists()


def test_delete_ignores_missing_keys(store, monkeypatch):
    monkeypatch.setattr(s3store, "DELETE_BATCH", 3)  # batching runs without 1,000 objects
    keys = [f"d/{i}" for i in range(7)]
    for key in keys:
        store.put_bytes(key, b"x")
    store.put_bytes("keep", b"k")
    store.delete([*keys, "missing", "d/missing/too"])
    store.delete([])
    assert store.list("") == ["keep"]


def test_put_file_and_download(store, tmp_path):
    source = tmp_path / "big.bin"
    source.write_bytes(uuid.uuid4().bytes * (MULTIPART // 16 + 1))
    store.put_file("files/big.bin", source)
    target = store.download("files/big.bin", tmp_path / "back" / "big.bin")
    assert target == tmp_path / "back" / "big.bin"
    assert target.read_bytes() == source.read_bytes()
    assert store.list("files/") == ["files/big.bin"]


def test_downloads_in_turn_to_one_path_leave_the_stored_files_as_they_were(store, tmp_path):
    """A reader that downloads one file after another to the same scratch path (the
    report reads every committed file so) gets each, and changes none of them."""
    store.put_bytes("a.bin", b"first file")
    store.put_bytes("b.bin", b"the second")
    scratch = tmp_path / "part.bin"
    assert store.download("a.bin", scratch).read_bytes() == b"first file"
    assert store.download("b.bin", scratch).read_bytes() == b"the second"
    assert store.get_bytes("a.bin") == b"first file"
    assert store.get_bytes("b.bin") == b"the second"


def test_put_file_is_all_or_nothing_to_a_reader(store, tmp_path):
    source = tmp_path / "big.bin"
    data = uuid.uuid4().bytes * (MULTIPART // 16 + 1)
    source.write_bytes(data)
    seen: list[int] = []
    done = threading.Event()

    def reader() -> None:
        while not done.is_set():
            try:
                seen.append(len(store.get_bytes("atomic.bin")))
            except ObjectNotFound:
                seen.append(0)

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        store.put_file("atomic.bin", source)
        # kept apart: the reader's last read may have begun before the put ended, and
        # end after this one
        after = len(store.get_bytes("atomic.bin"))
    finally:
        done.set()
        thread.join()
    assert set(seen) <= {0, len(data)}
    assert after == len(data)


def test_put_written_holds_what_was_written_or_nothing(store):
    data = uuid.uuid4().bytes * (MULTIPART // 16 + 1)  # in parts, on S3
    store.put_written("files/written.bin", lambda out: [out.write(data[:7]), out.write(data[7:])])
    assert store.get_bytes("files/written.bin") == data

    def fails(out) -> None:
        out.write(data)
        raise RuntimeError("the writer failed")

    with pytest.raises(RuntimeError):
        store.put_written("files/failed.bin", fails)
    assert store.list("files/") == ["files/written.bin"]


def test_put_if_absent_creates_once(store):
    assert store.put_if_absent("marker", b"first")
    assert not store.put_if_absent("marker", b"second")
    assert store.get_bytes("marker") == b"first"


def test_put_if_absent_race_has_one_winner(store):
    for round_ in range(6):
        key, barrier = f"race/{round_}", threading.Barrier(2)

        def claim(name: str, key=key, barrier=barrier) -> tuple[str, bool]:
            barrier.wait()
            return name, store.put_if_absent(key, name.encode())

        with ThreadPoolExecutor(2) as pool:
            results = dict(pool.map(claim, ["left", "right"]))
        winners = [name for name, won in results.items() if won]
        assert len(winners) == 1, results
        assert store.get_bytes(key) == winners[0].encode()


def test_bad_keys_are_refused(store):
    for key in ["", "/abs", "a//b", "../up", "a/./b", "a/"]:
        with pytest.raises(ValueError):
            store.put_bytes(key, b"x")


def test_polars_reads_parquet_through_uri(store, tmp_path, monkeypatch):
    frame = pl.DataFrame({"id": [1, 2, 3], "text": ["a", "b", "ç"]})
    frame.write_parquet(tmp_path / "f.parquet")
    store.put_file("data/f.parquet", tmp_path / "f.parquet")
    options = store.storage_options()
    for name in (
        "AWS_ENDPOINT_URL",
        "AWS_ALLOW_HTTP",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
    ):
        monkeypatch.delenv(name, raising=False)  # polars must find it all in the options
    read = pl.read_parquet(store.uri("data/f.parquet"), storage_options=options)
    assert read.equals(frame)
    scanned = pl.scan_parquet(store.uri("data/*.parquet"), storage_options=options)
    assert scanned.collect().equals(frame)


# --- local specifics ----------------------------------------------------------------------


def test_local_list_skips_temp_files_and_writes_leave_none(tmp_path):
    store = open_store(str(tmp_path / "s"))
    store.put_bytes("a/x", b"1")
    assert store.put_if_absent("a/y", b"2")
    assert not store.put_if_absent("a/y", b"3")
    store.put_file("a/z", Path(store.uri("a/x")))
    assert sorted(p.name for p in (tmp_path / "s" / "a").iterdir()) == ["x", "y", "z"]
    (tmp_path / "s" / "a" / f"{TEMP_PREFIX}crashed").write_bytes(b"half")
    store.put_bytes(".nightshift-staging/part", b"p")  # dot keys are still keys
    assert store.list("") == [".nightshift-staging/part", "a/x", "a/y", "a/z"]


def test_open_store_locations(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert isinstance(open_store("rel/dir"), LocalStore)
    assert open_store("rel/dir/").root == str(tmp_path / "rel" / "dir")
    assert open_store(f"file://{tmp_path}/x").root == str(tmp_path / "x")
    assert not (tmp_path / "rel").exists()  # created on the first write only
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    assert open_store("s3://bkt/some/prefix/").root == "s3://bkt/some/prefix"
    assert open_store("s3://bkt").uri("k") == "s3://bkt/k"
    for bad in ["s3://", "gs://bkt/x"]:
        with pytest.raises(StoreAccessError):
            open_store(bad)


# --- S3: refusals name the fix ------------------------------------------------------------


def test_s3_storage_options(s3_env):
    options = open_store(f"s3://{s3_env.bucket}/p").storage_options()
    assert options == {
        "aws_region": "us-east-1",
        "aws_endpoint_url": s3_env.endpoint,
        "aws_allow_http": "true",
        "aws_access_key_id": s3_env.access_key,
        "aws_secret_access_key": s3_env.secret_key,
    }
    assert open_store(str(Path.cwd())).storage_options() is None


@pytest.mark.parametrize(
    ("variable", "value", "hint"),
    [
        ("AWS_SECRET_ACCESS_KEY", "wrong-secret", "secret key does not match"),
        ("AWS_ACCESS_KEY_ID", "nobody", "access key id is unknown"),
    ],
)
def test_s3_wrong_credentials_are_access_errors(s3_env, monkeypatch, variable, value, hint):
    monkeypatch.setenv(variable, value)
    store = open_store(f"s3://{s3_env.bucket}/p")
    with pytest.raises(StoreAccessError, match=hint):
        store.get_bytes("k")
    operations = [
        lambda: store.put_bytes("k", b"x"),
        lambda: store.get_bytes("k"),
        lambda: store.exists("k"),
        lambda: store.list(""),
        lambda: store.delete(["k"]),
        lambda: store.put_if_absent("k", b"x"),
    ]
    for operation in operations:
        with pytest.raises(StoreAccessError, match=variable) as caught:
            operation()
        assert s3_env.bucket in str(caught.value)


def test_s3_missing_bucket_is_an_access_error(s3_env, tmp_path):
    store = open_store("s3://no-such-bucket/p")
    for operation in [
        lambda: store.put_bytes("k", b"x"),
        lambda: store.get_bytes("k"),
        lambda: store.list(""),
        lambda: store.put_file("k", tmp_path / "f"),
    ]:
        (tmp_path / "f").write_bytes(b"f")
        with pytest.raises(StoreAccessError, match="bucket 'no-such-bucket' does not exist"):
            operation()


def test_s3_no_credentials_is_an_access_error(s3_env, monkeypatch):
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    store = open_store(f"s3://{s3_env.bucket}/p")
    with pytest.raises(StoreAccessError, match="no AWS credentials.*AWS_PROFILE"):
        store.get_bytes("k")


# --- S3 through a proxy that breaks requests ---------------------------------------------


@pytest.mark.parametrize("kind", FAULT_KINDS)
def test_s3_each_fault_is_retried_for_each_operation(
    s3_env, fault_proxy, monkeypatch, tmp_path, fast_backoff, kind
):
    """One request of every operation fails one way; the operation still succeeds.

    ``every`` picks the request: the first, or for a download the GET after its HEAD.
    """
    source = tmp_path / "f.bin"
    source.write_bytes(b"file" * 1000)
    location = fresh_location(s3_env.bucket)
    direct = open_store(location)
    direct.put_bytes("there", b"x" * 5000)
    fetch = lambda s: s.download("there", tmp_path / "d").read_bytes()  # noqa: E731
    operations = [
        ("put_bytes", 1, lambda s: s.put_bytes("a", b"A" * 3000), None),
        ("get_bytes", 1, lambda s: s.get_bytes("there"), b"x" * 5000),
        ("exists", 1, lambda s: s.exists("there"), True),
        ("list", 1, lambda s: s.list(""), ["a", "there"]),
        ("put_if_absent", 1, lambda s: s.put_if_absent("new", b"n"), True),
        ("put_file", 1, lambda s: s.put_file("f", source), None),
        ("download head", 1, fetch, b"x" * 5000),
        ("download body", 2, fetch, b"x" * 5000),
        ("delete", 1, lambda s: s.delete(["a"]), None),
    ]
    for name, every, operation, expected in operations:
        proxy = fault_proxy(every=every, kinds=(kind,), max_faults=1)
        assert operation(through(proxy, monkeypatch, location)) == expected, name
        assert proxy.injected == {kind: 1}, name
    assert direct.get_bytes("f") == source.read_bytes()
    assert direct.list("") == ["f", "new", "there"]


def test_s3_lost_answer_to_a_conditional_put(s3_env, fault_proxy, monkeypatch, fast_backoff):
    """The server created the key but the answer was lost: the retry's 412 is ours."""
    proxy = fault_proxy(every=1, kinds=("drop_after",), max_faults=2)
    store = through(proxy, monkeypatch, fresh_location(s3_env.bucket))
    assert store.put_if_absent("mine", b"ours")
    store.put_bytes("theirs", b"theirs")  # second fault: a plain PUT, retried
    assert not store.put_if_absent("theirs", b"ours")
    assert not store.put_if_absent("mine", b"ours")
    assert store.get_bytes("theirs") == b"theirs"
    assert proxy.faults == 2


def test_s3_gives_up_with_a_store_error(s3_env, fault_proxy, monkeypatch, fast_backoff):
    proxy = fault_proxy(1.0, kinds=("error500",))
    store = through(proxy, monkeypatch, fresh_location(s3_env.bucket))
    with pytest.raises(StoreError, match=r"S3 put of s3://.*/k failed: InternalError") as caught:
        store.put_bytes("k", b"x")
    assert not isinstance(caught.value, StoreAccessError)
    assert proxy.requests == s3store.MAX_ATTEMPTS


def test_s3_survives_a_30_percent_fault_rate(s3_env, fault_proxy, monkeypatch, tmp_path):
    """Every kind of fault at once, with botocore's real backoff, on 8 threads."""
    proxy = fault_proxy(0.3, seed=7)
    store = through(proxy, monkeypatch, fresh_location(s3_env.bucket))
    objects = {f"obj/{i:02d}": uuid.uuid4().bytes * (i * 50 + 1) for i in range(20)}
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda kv: store.put_bytes(*kv), objects.items()))
        assert all(pool.map(lambda k: store.put_if_absent(f"mark/{k}", b"m"), objects))
        read = dict(zip(objects, pool.map(store.get_bytes, objects), strict=True))
        assert all(pool.map(store.exists, objects))
    assert read == objects
    assert store.list("obj/") == sorted(objects)
    source = tmp_path / "f.bin"
    source.write_bytes(uuid.uuid4().bytes * 4096)
    store.put_file("file", source)
    assert store.download("file", tmp_path / "back").read_bytes() == source.read_bytes()
    store.delete(store.list(""))
    assert store.list("") == []
    # Seed 7 gives 128 requests with 37 faults, every kind among them.
    assert proxy.faults >= 20, proxy.injected
    assert set(proxy.injected) == set(FAULT_KINDS), proxy.injected
