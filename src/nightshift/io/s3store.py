"""The S3 backend of ``ObjectStore``: boto3 with retries that were seen to work.

Why it looks like this:

- botocore's "standard" retry mode already retries throttling (SlowDown, 503), 500,
  502, 504 and dropped or reset connections, for PUT, GET, HEAD, LIST and DELETE alike
  (tests/test_objectstore.py drives each through a fault-injecting proxy). It does not
  retry a GET whose body is cut off after the headers arrived, so ``get_bytes`` rereads
  the object itself; ``download`` and ``put_file`` use boto3's managed transfer, which
  retries interrupted bodies and uploads big files in parts.
- A conditional PUT whose answer was lost is retried by botocore and then fails with
  412, although our own first attempt created the object. ``put_if_absent`` therefore
  compares the stored bytes with its own after a retried 412 (make payloads unique).
- Errors a user can fix (no bucket, wrong key or secret, no permission, no credentials)
  become ``StoreAccessError`` naming the bucket and the fix; a missing key becomes
  ``ObjectNotFound``; anything left after the retries is a ``StoreError``.
"""

from __future__ import annotations

import contextlib
import random
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import BinaryIO
from urllib.parse import urlsplit

import botocore.loaders
import botocore.session
from boto3.s3.transfer import TransferConfig, create_transfer_manager
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionClosedError,
    IncompleteReadError,
    NoCredentialsError,
    PartialCredentialsError,
    ReadTimeoutError,
    ResponseStreamingError,
)
from s3transfer.manager import TransferManager

from nightshift.errors import ObjectNotFound, StoreAccessError, StoreError
from nightshift.io.keys import check_key, check_prefix

# Total attempts per request, first included. Standard mode backs off exponentially with
# jitter (up to 1, 2, 4... s, at most 20 s between two attempts).
MAX_ATTEMPTS = 10
CLIENT_CONFIG = Config(
    retries={"mode": "standard", "total_max_attempts": MAX_ATTEMPTS},
    connect_timeout=10,
    read_timeout=60,
    tcp_keepalive=True,
    max_pool_connections=32,
)
TRANSFER_CONFIG = TransferConfig(preferred_transfer_client="classic")  # 8 MiB parts
BODY_ATTEMPTS = 5  # rereads of a GET whose body broke off
CONFLICT_ATTEMPTS = 5  # conditional PUTs answered 409 (a concurrent one in flight)
DELETE_BATCH = 1000  # the most keys one DeleteObjects request takes

# What reading a GET body raises when the connection breaks after the headers.
_BODY_ERRORS = (
    ResponseStreamingError,
    IncompleteReadError,
    ReadTimeoutError,
    ConnectionClosedError,
)
_MISSING = {"NoSuchKey", "404", "NotFound"}
_CREDENTIALS = "set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE"
_REFUSALS = {
    "InvalidAccessKeyId": f"the access key id is unknown to the server ({_CREDENTIALS})",
    "SignatureDoesNotMatch": "the secret key does not match the access key id "
    f"(check AWS_SECRET_ACCESS_KEY; {_CREDENTIALS})",
    "ExpiredToken": "the session token has expired (renew AWS_SESSION_TOKEN or the login)",
    "InvalidToken": "the session token is invalid (check AWS_SESSION_TOKEN)",
    "AccessDenied": f"access denied: the credentials lack permission here ({_CREDENTIALS} "
    "for an identity that has it)",
    "AllAccessDisabled": "all access to this bucket is disabled",
    "403": f"access denied: wrong credentials or no permission ({_CREDENTIALS})",
}


class S3Store:
    """Objects under ``s3://bucket/prefix``; one thread-safe botocore client per store."""

    def __init__(
        self, bucket: str, prefix: str = "", *, session: botocore.session.Session | None = None
    ) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.root = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        self._session = session or _new_session()
        self._client = self._session.create_client("s3", config=CLIENT_CONFIG)

    def __repr__(self) -> str:
        return f"S3Store({self.root!r}, endpoint={self._client.meta.endpoint_url!r})"

    def uri(self, key: str) -> str:
        return f"{self.root}/{check_key(key)}"

    def _key(self, key: str) -> str:
        check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def put_bytes(self, key: str, data: bytes | memoryview) -> None:
        body = bytes(data)  # botocore takes bytes or a file, not a view
        with self._errors("put", key):
            self._client.put_object(Bucket=self.bucket, Key=self._key(key), Body=body)

    def put_file(self, key: str, path: Path) -> None:
        """Managed transfer: one PUT, or a multipart upload that appears when complete."""
        with self._errors("put", key), self._transfers() as transfers:
            transfers.upload(str(path), self.bucket, self._key(key)).result()

    def put_written(self, key: str, write: Callable[[BinaryIO], object]) -> None:
        """What ``write`` writes, through a temp file and the managed transfer."""
        with tempfile.TemporaryDirectory(prefix="nightshift-") as tmp:
            path = Path(tmp) / "object"
            with path.open("wb") as out:
                write(out)
            self.put_file(key, path)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        for attempt in range(CONFLICT_ATTEMPTS):
            try:
                self._client.put_object(
                    Bucket=self.bucket, Key=self._key(key), Body=data, IfNoneMatch="*"
                )
                return True
            except ClientError as exc:
                code = _code(exc)
                if code in ("PreconditionFailed", "412"):
                    return _retried(exc) and self._holds(key, data)
                if code not in ("ConditionalRequestConflict", "409"):
                    raise self._translate(exc, "put", key) from exc
            except BotoCoreError as exc:
                raise self._translate(exc, "put", key) from exc
            time.sleep(_backoff(attempt))  # 409: another conditional PUT is in flight
        return False

    def _holds(self, key: str, data: bytes) -> bool:
        """Whether ``key`` holds ``data``: our lost-answer attempt may have created it."""
        with contextlib.suppress(ObjectNotFound):
            return self.get_bytes(key) == data
        return False

    def get_bytes(self, key: str) -> bytes:
        """One GET; a body that breaks off after the headers is fetched again."""
        attempt = 0
        with self._errors("get", key):
            while True:
                response = self._client.get_object(Bucket=self.bucket, Key=self._key(key))
                try:
                    return response["Body"].read()
                except _BODY_ERRORS:
                    attempt += 1
                    if attempt == BODY_ATTEMPTS:
                        raise
                    time.sleep(_backoff(attempt))

    def exists(self, key: str) -> bool:
        """HEAD: a 404 carries no error code, so a missing bucket reads as a missing key."""
        try:
            self._client.head_object(Bucket=self.bucket, Key=self._key(key))
        except ClientError as exc:
            if _code(exc) in _MISSING:
                return False
            raise self._translate(exc, "head", key) from exc
        except BotoCoreError as exc:
            raise self._translate(exc, "head", key) from exc
        return True

    def list(self, prefix: str = "") -> list[str]:
        full = self._key_prefix() + check_prefix(prefix)
        cut = len(self.prefix) + 1 if self.prefix else 0
        keys: list[str] = []
        with self._errors("list", prefix):
            pages = self._client.get_paginator("list_objects_v2")
            for page in pages.paginate(Bucket=self.bucket, Prefix=full):
                keys.extend(item["Key"][cut:] for item in page.get("Contents", []))
        return sorted(keys)

    def _key_prefix(self) -> str:
        return f"{self.prefix}/" if self.prefix else ""

    def delete(self, keys: Iterable[str]) -> None:
        names = [self._key(key) for key in keys]
        for start in range(0, len(names), DELETE_BATCH):
            batch = [{"Key": name} for name in names[start : start + DELETE_BATCH]]
            with self._errors("delete", ""):
                answer = self._client.delete_objects(
                    Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True}
                )
            if answer.get("Errors"):  # per-key refusals inside a 200 answer
                first, count = answer["Errors"][0], len(answer["Errors"])
                key = first.get("Key", "")[len(self._key_prefix()) :]
                failure = self._refusal(str(first.get("Code")), first.get("Message"), "delete", key)
                raise type(failure)(f"{failure} ({count} keys not deleted)")

    def download(self, key: str, path: Path) -> Path:
        """Managed transfer into ``path.XXXXXXXX``, renamed onto ``path`` when whole."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with self._errors("get", key), self._transfers() as transfers:
            transfers.download(self.bucket, self._key(key), str(path)).result()
        return path

    def storage_options(self) -> dict[str, str] | None:
        """What polars needs to open ``uri(key)`` as this client does.

        The endpoint and region are the ones botocore resolved (environment or config
        files), and so are the credentials, so a profile works for polars as well.
        Credentials go in explicitly: polars takes ``aws_allow_http`` as a reason not to
        ask boto3 itself, and its Rust client then tries the EC2 metadata address.
        Temporary credentials are passed as they are now: a read outlasting them fails.
        """
        meta = self._client.meta
        options = {"aws_region": meta.region_name or "us-east-1"}
        if _custom_endpoint(meta.endpoint_url):  # AWS's own: polars finds it by region
            options["aws_endpoint_url"] = meta.endpoint_url
            if meta.endpoint_url.startswith("http://"):
                options["aws_allow_http"] = "true"
        if (meta.config.s3 or {}).get("addressing_style") == "virtual":
            options["aws_virtual_hosted_style_request"] = "true"
        credentials = self._session.get_credentials()
        if credentials is not None:
            frozen = credentials.get_frozen_credentials()
            options["aws_access_key_id"] = frozen.access_key
            options["aws_secret_access_key"] = frozen.secret_key
            if frozen.token:
                options["aws_session_token"] = frozen.token
        return options

    def _transfers(self) -> TransferManager:
        """boto3's managed transfer; as a context manager it cancels on an exception."""
        return create_transfer_manager(self._client, TRANSFER_CONFIG)

    @contextlib.contextmanager
    def _errors(self, op: str, key: str) -> Iterator[None]:
        try:
            yield
        except (ClientError, BotoCoreError) as exc:
            raise self._translate(exc, op, key) from exc

    def _translate(self, exc: Exception, op: str, key: str) -> StoreError:
        """A boto exception as the store error it means, naming the object and the fix."""
        where = self.uri(key) if key else self.root
        if isinstance(exc, (NoCredentialsError, PartialCredentialsError)):
            return StoreAccessError(f"no AWS credentials found for {where}: {_CREDENTIALS}")
        if isinstance(exc, ClientError):
            error = exc.response.get("Error", {})
            return self._refusal(_code(exc), error.get("Message"), op, key)
        return StoreError(f"S3 {op} of {where} failed after retries: {exc}")

    def _refusal(self, code: str, message: str | None, op: str, key: str) -> StoreError:
        where = self.uri(key) if key else self.root
        if code == "NoSuchBucket":
            endpoint = self._client.meta.endpoint_url
            return StoreAccessError(
                f"S3 bucket {self.bucket!r} does not exist at {endpoint} (reading or writing "
                f"{where}): create it, or fix the s3:// location or AWS_ENDPOINT_URL"
            )
        if code in _REFUSALS:
            return StoreAccessError(f"S3 refused {op} of {where}: {_REFUSALS[code]}")
        if code in _MISSING:
            return ObjectNotFound(f"{where} does not exist")
        return StoreError(f"S3 {op} of {where} failed: {code} {message or ''}".rstrip())


_loader_lock = threading.Lock()
_loader: botocore.loaders.Loader | None = None


def _new_session() -> botocore.session.Session:
    """A session that reads the environment now, sharing parsed service models.

    Each session resolves endpoint, region and credentials afresh; only the model files,
    whose parsing made every new client cost 0.1-0.5 s, are loaded once per process.
    """
    global _loader
    session = botocore.session.get_session()
    with _loader_lock:
        if _loader is None:
            _loader = session.get_component("data_loader")
        else:
            session.register_component("data_loader", _loader)
    return session


def _custom_endpoint(url: str | None) -> bool:
    host = urlsplit(url or "").hostname or ""
    return bool(host) and not host.endswith((".amazonaws.com", ".amazonaws.com.cn"))


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _retried(exc: ClientError) -> bool:
    """Whether botocore sent this request more than once before the answer we got."""
    return exc.response.get("ResponseMetadata", {}).get("RetryAttempts", 0) > 0


def _backoff(attempt: int) -> float:
    """Full jitter, as botocore does: up to 0.2, 0.4, 0.8... s, at most 5 s."""
    return random.uniform(0, min(5.0, 0.2 * 2**attempt))
