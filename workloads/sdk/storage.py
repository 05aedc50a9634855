"""Where models live: a directory (hostPath or PVC mount) or S3-compatible object storage.

``open_backend(location)``: an absolute path is a directory; ``s3://bucket/prefix`` is a
bucket. S3 credentials, region and endpoint come from the standard AWS environment
(``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION``, ``AWS_ENDPOINT_URL_S3`` or
``AWS_ENDPOINT_URL``), which the platform fills from the Secret the resource names. A custom
endpoint (MinIO, Ceph, versitygw, ...) is addressed path-style.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath
from typing import Any, Protocol


class StorageError(Exception):
    """The store cannot be read or written; the message names the location."""


class NotFoundError(StorageError):
    """The object or file does not exist."""


class Backend(Protocol):
    """A flat namespace of objects under one root, addressed by relative '/'-paths."""

    @property
    def location(self) -> str:
        """The root, as a user would name it (a directory or s3://bucket/prefix)."""
        ...

    def url(self, rel: str) -> str:
        """Where ``rel`` lives, as a user would name it."""
        ...

    def read(self, rel: str) -> bytes:
        """The object's bytes; NotFoundError when there is none."""
        ...

    def write(self, rel: str, data: bytes) -> None:
        """Store ``data`` under ``rel``; readers never see a half-written object."""
        ...


def _clean(rel: str) -> str:
    path = PurePosixPath(rel)
    if path.is_absolute() or ".." in path.parts or not path.parts:
        raise StorageError(f"{rel!r} is not a relative path inside the store")
    return str(path)


class DirectoryBackend:
    """Files under a directory; writes go to a temporary name, fsync, then rename."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)

    @property
    def location(self) -> str:
        return str(self.root)

    def url(self, rel: str) -> str:
        return str(self.root / _clean(rel))

    def read(self, rel: str) -> bytes:
        path = self.root / _clean(rel)
        try:
            return path.read_bytes()
        except FileNotFoundError:
            raise NotFoundError(f"{path} does not exist") from None
        except OSError as exc:
            raise StorageError(f"cannot read {path}: {exc}") from None

    def write(self, rel: str, data: bytes) -> None:
        path = self.root / _clean(rel)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with tmp.open("wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            tmp.replace(path)
        except OSError as exc:
            raise StorageError(f"cannot write {path}: {exc}") from None


class S3Backend:
    """Objects under ``s3://bucket/prefix`` (boto3; one PUT is atomic for readers)."""

    def __init__(self, bucket: str, prefix: str = "", client: Any = None) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.client = client if client is not None else s3_client()

    @property
    def location(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}".rstrip("/")

    def _key(self, rel: str) -> str:
        rel = _clean(rel)
        return f"{self.prefix}/{rel}" if self.prefix else rel

    def url(self, rel: str) -> str:
        return f"s3://{self.bucket}/{self._key(rel)}"

    def read(self, rel: str) -> bytes:
        from botocore.exceptions import BotoCoreError, ClientError

        key = self._key(rel)
        try:
            response = self.client.get_object(Bucket=self.bucket, Key=key)
            return bytes(response["Body"].read())
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            if code in ("NoSuchKey", "404", "NotFound"):
                raise NotFoundError(f"s3://{self.bucket}/{key} does not exist") from None
            raise StorageError(f"cannot read s3://{self.bucket}/{key}: {exc}") from None
        except BotoCoreError as exc:
            raise StorageError(f"cannot read s3://{self.bucket}/{key}: {exc}") from None

    def write(self, rel: str, data: bytes) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        key = self._key(rel)
        try:
            self.client.put_object(Bucket=self.bucket, Key=key, Body=data)
        except (ClientError, BotoCoreError) as exc:
            raise StorageError(f"cannot write s3://{self.bucket}/{key}: {exc}") from None


def s3_client() -> Any:
    """A boto3 S3 client from the standard AWS environment; path-style addressing when a
    custom endpoint is set (S3-compatible servers rarely serve virtual-host buckets)."""
    try:
        import boto3
        from botocore.config import Config
    except ImportError as exc:  # pragma: no cover - the workloads extra installs boto3
        raise StorageError(f"S3 storage needs boto3 ({exc})") from None
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    config = Config(s3={"addressing_style": "path"} if endpoint else {})
    # A fresh session: boto3's default one keeps the credentials it first resolved.
    session = boto3.session.Session()
    return session.client("s3", endpoint_url=endpoint or None, config=config)


def parse_s3(uri: str) -> tuple[str, str]:
    """(bucket, prefix) of ``s3://bucket/prefix``."""
    if not uri.startswith("s3://"):
        raise StorageError(f"{uri!r} is not an s3:// URI")
    bucket, _, prefix = uri[len("s3://") :].partition("/")
    if not bucket:
        raise StorageError(f"{uri!r} names no bucket (s3://bucket/prefix)")
    return bucket, prefix


def open_backend(location: str) -> Backend:
    """A directory (absolute path) or S3 (``s3://bucket/prefix``) backend."""
    if location.startswith("s3://"):
        bucket, prefix = parse_s3(location)
        return S3Backend(bucket, prefix)
    if not location or not Path(location).is_absolute():
        raise StorageError(
            f"model store {location!r}: use an absolute directory or s3://bucket/prefix"
        )
    return DirectoryBackend(Path(location))
