"""``Volume``: object storage mounted as a directory on every node of a pool.

A volume is a value, validated when it is made; ``ComputePool(volumes=[...])`` hands the pool's
volumes to its provider in the ``ProvisionRequest``, and the provider mounts them on each node
before any worker starts and unmounts them when the node is closed
(``providers/volumes.py`` says how: s3fs-fuse, installed by the host's preparation when it is
missing).

::

    sky.Volume(bucket="s3://my-data/imagenet", mount="/data", read_only=True)
      -> on each node: s3fs my-data:/imagenet /data -o ro ...   (before the workers start)
      -> at close:     fusermount -u /data                      (after the workers are gone)

Credentials: ``access_key_id`` and ``secret_access_key`` when given (written to a file only the
node's user can read, removed at unmount); otherwise the node's own: on AWS the instance profile
``AWS(iam_instance_profile=...)`` gives the nodes, elsewhere what s3fs finds on the host
(``~/.passwd-s3fs``, ``/etc/passwd-s3fs``, ``~/.aws/credentials``).
"""

from __future__ import annotations

import itertools
import posixpath
import re
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

# S3's bucket names: 3-63 characters of lower-case letters, digits, dots and hyphens.
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


class Volume(BaseModel):
    """An S3 bucket (or a prefix of it) mounted at ``mount`` on every node.

    - ``bucket``: ``"s3://bucket"`` or ``"s3://bucket/prefix"`` (``"bucket"`` with
      ``prefix="..."``, skyward 0.5's spelling, is the same).
    - ``mount``: an absolute path on the nodes; made if missing (with password-less sudo
      when the node's user cannot), removed at unmount if the pool made it.
    - ``read_only``: mounted read-only (the default), so a bug cannot delete the data set.
    - ``endpoint_url``: an S3-compatible service instead of AWS (MinIO, Ceph, R2);
      path-style requests are used with it. ``region``: the bucket's region, when the
      service needs it for signing.
    - ``access_key_id`` / ``secret_access_key``: explicit credentials, both or neither.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    bucket: str
    mount: str
    read_only: bool = True
    endpoint_url: str | None = Field(default=None, pattern=r"^https?://[^/\s]+")
    region: str | None = Field(default=None, pattern=r"^[a-z0-9-]+$")
    access_key_id: str | None = Field(default=None, min_length=1, pattern=r"^[^:\s]+$")
    secret_access_key: SecretStr | None = None

    @model_validator(mode="before")
    @classmethod
    def _bucket_and_prefix(cls, given: Any) -> Any:
        """``bucket="my-bucket", prefix="datasets/"`` (skyward 0.5's spelling) is
        ``bucket="s3://my-bucket/datasets"``."""
        if not isinstance(given, dict) or not isinstance(given.get("bucket"), str):
            return given
        given = dict(given)
        bucket: str = given["bucket"]
        prefix = given.pop("prefix", None)
        if "://" not in bucket:
            bucket = f"s3://{bucket}"
        if prefix:
            bucket = f"{bucket.rstrip('/')}/{str(prefix).strip('/')}"
        given["bucket"] = bucket
        return given

    @field_validator("bucket")
    @classmethod
    def _bucket(cls, bucket: str) -> str:
        if not bucket.startswith("s3://"):
            raise ValueError(
                f"only S3 buckets (and S3-compatible services, with endpoint_url=) can be "
                f"mounted: give 's3://my-bucket/prefix' or 'my-bucket', not {bucket!r}"
            )
        name = bucket[len("s3://") :].split("/", 1)[0]
        if not _BUCKET.match(name):
            raise ValueError(
                f"{name!r} is not an S3 bucket name (3-63 lower-case letters, digits, dots "
                f"and hyphens)"
            )
        return bucket.rstrip("/") if bucket.count("/") > 2 else bucket

    @field_validator("mount")
    @classmethod
    def _mount(cls, mount: str) -> str:
        if not mount.startswith("/"):
            raise ValueError(f"mount must be an absolute path on the nodes, not {mount!r}")
        normal = posixpath.normpath(mount)
        if normal == "/" or any(c in mount for c in "\n\0"):
            raise ValueError(f"mount {mount!r} cannot be a mount point for a volume")
        return normal

    @model_validator(mode="after")
    def _both_keys(self) -> Volume:
        if (self.access_key_id is None) != (self.secret_access_key is None):
            raise ValueError(
                "give both access_key_id and secret_access_key, or neither (the node's own "
                "credentials are used then)"
            )
        return self

    @property
    def bucket_name(self) -> str:
        return self.bucket[len("s3://") :].split("/", 1)[0]

    @property
    def prefix(self) -> str:
        """The path inside the bucket, ``""`` for the whole bucket."""
        parts = self.bucket[len("s3://") :].split("/", 1)
        return parts[1].strip("/") if len(parts) == 2 else ""

    @property
    def explicit_credentials(self) -> bool:
        return self.access_key_id is not None


def check_volumes(volumes: Sequence[Volume]) -> tuple[Volume, ...]:
    """Refuse two volumes on one mount point, or one inside another's."""
    mounts = sorted(v.mount for v in volumes)
    for outer, inner in itertools.pairwise(mounts):
        if inner == outer or inner.startswith(outer + "/"):
            raise ValueError(
                f"volumes mounted at {outer} and {inner} overlap; give each its own directory"
            )
    return tuple(volumes)
