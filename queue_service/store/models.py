"""The service's records: one row per session request, from PENDING to its end (docs/source/explanation/architecture.md, "The session lifecycle").

The queue lives here and nowhere else, so a hub or service restart loses no request and leaks no
allocation: the scheduler's state is rebuilt from these rows.
"""

from __future__ import annotations

import json
from datetime import UTC, date, datetime

from sqlalchemy import BigInteger, Boolean, Date, DateTime, Float, Index, Integer, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from queue_service.core.status import Status


def utcnow() -> datetime:
    return datetime.now(UTC)


def as_utc(moment: datetime) -> datetime:
    """SQLite hands back naive datetimes even for timezone-aware columns; they are UTC."""
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


class Base(DeclarativeBase):
    pass


class SessionRecord(Base):
    __tablename__ = "sessions"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    # Queue order: a monotonically increasing number, so FIFO survives restarts and clock changes.
    seq: Mapped[int] = mapped_column(Integer, nullable=False, unique=True)
    user: Mapped[str] = mapped_column(String(255), nullable=False)
    #: The user's hub account (accounts.py): a later account of the same name is another.
    account: Mapped[str] = mapped_column(String(32), nullable=False, default="")
    server_name: Mapped[str] = mapped_column(String(255), nullable=False, default="")
    status: Mapped[str] = mapped_column(String(20), nullable=False, default=Status.PENDING)
    image: Mapped[str] = mapped_column(String(255), nullable=False)
    cpu: Mapped[float] = mapped_column(Float, nullable=False)
    mem: Mapped[int] = mapped_column(BigInteger, nullable=False)
    fgpu: Mapped[float] = mapped_column(Float, nullable=False, default=0.0)
    resource_group: Mapped[str | None] = mapped_column(String(255), nullable=True)
    node: Mapped[str | None] = mapped_column(String(255), nullable=True)
    grant_json: Mapped[str | None] = mapped_column(Text, nullable=True)
    reason: Mapped[str] = mapped_column(Text, nullable=False, default="")
    skips: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    created: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    scheduled_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    started: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    ended: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    # Why it ended, as a code of end_reasons.py (None while active); `reason` says it in words.
    end_reason: Mapped[str | None] = mapped_column(String(32), nullable=True)
    # When its ended named server was removed from the hub (server_removal.py); None: not yet.
    server_removed: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    #: A batch job's canonical JSON (image_catalog/job_options.py); None: an interactive session.
    job_json: Mapped[str | None] = mapped_column(Text, nullable=True)
    #: A job's exit code and the end of its log, once it has ended by itself (job_ends.py).
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    log_tail: Mapped[str | None] = mapped_column(Text, nullable=True)

    __table_args__ = (
        Index("ix_sessions_status", "status"),
        Index("ix_sessions_user_server", "user", "server_name"),
        # The history (history.py): newest ended first, everyone's or one user's.
        Index("ix_sessions_ended", "ended"),
        Index("ix_sessions_user_ended", "user", "ended"),
        # The ended named servers still to remove from the hub, oldest first.
        Index("ix_sessions_server_removed", "server_removed", "ended"),
    )

    @property
    def gpus(self) -> dict[str, float]:
        return json.loads(self.grant_json)["gpus"] if self.grant_json else {}


class ImageRecord(Base):
    """One catalog entry: an image students may start, who may start it, and its last check."""

    __tablename__ = "images"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(63), nullable=False, unique=True)
    display_name: Mapped[str] = mapped_column(String(255), nullable=False, default="")
    image: Mapped[str] = mapped_column(String(255), nullable=False)
    framework: Mapped[str] = mapped_column(String(100), nullable=False, default="")
    version: Mapped[str] = mapped_column(String(100), nullable=False, default="")
    description: Mapped[str] = mapped_column(Text, nullable=False, default="")
    # {"min": {...}, "default": {...}, "max": {...}}: read whole, never queried by slot.
    resources_json: Mapped[str] = mapped_column(Text, nullable=False, default="{}")
    gpu: Mapped[bool] = mapped_column(Boolean, nullable=False, default=False)
    # Hub groups that may use it, a JSON list; empty means everyone.
    groups_json: Mapped[str] = mapped_column(Text, nullable=False, default="[]")
    hidden: Mapped[bool] = mapped_column(Boolean, nullable=False, default=False)
    owner: Mapped[str | None] = mapped_column(String(255), nullable=True)
    # The owner's hub account (its creation time): a later user of the same name is not the owner.
    # Empty for images given to a name alone (before this column, or to a user not yet created).
    owner_created: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    # Where it came from: "seed" (catalog.yaml), "api" (an instructor), "commit" (a session).
    source: Mapped[str] = mapped_column(String(20), nullable=False, default="api")
    # Swarm mode: the registry digest the reference was pinned to when first found there
    # (registry_images.py); sessions start from it. Cleared by a new reference or a check.
    digest: Mapped[str | None] = mapped_column(String(100), nullable=True)
    check_ok: Mapped[bool | None] = mapped_column(Boolean, nullable=True)
    check_message: Mapped[str] = mapped_column(Text, nullable=False, default="")
    checked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    created: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class ImageSeed(Base):
    """The catalog.yaml entry as last seeded, per name: seeding then changes only what nobody
    edited since, and never brings back an image an instructor deleted."""

    __tablename__ = "image_seeds"

    name: Mapped[str] = mapped_column(String(63), primary_key=True)
    entry_json: Mapped[str] = mapped_column(Text, nullable=False)


class UsageDay(Base):
    """What ended sessions used, per UTC day, user, account and resource group (usage.py's
    arithmetic), written in the transaction that ends each session: the figures outlive the
    session records. `account` tells a user's accounts of one name apart (accounts.py)."""

    __tablename__ = "usage_days"

    day: Mapped[date] = mapped_column(Date, primary_key=True)
    user: Mapped[str] = mapped_column(String(255), primary_key=True)
    account: Mapped[str] = mapped_column(String(32), primary_key=True, default="")
    resource_group: Mapped[str] = mapped_column(String(255), primary_key=True)
    cpu_hours: Mapped[float] = mapped_column(Float, nullable=False, default=0.0)
    mem_gib_hours: Mapped[float] = mapped_column(Float, nullable=False, default=0.0)
    fgpu_hours: Mapped[float] = mapped_column(Float, nullable=False, default=0.0)

    __table_args__ = (Index("ix_usage_days_user_day", "user", "day"),)


class UsageRecorded(Base):
    """The sessions whose use is in `usage_days` already: each is added once, and a session
    not listed here (running, or ended a moment ago) is counted from its record instead."""

    __tablename__ = "usage_recorded"

    session_id: Mapped[str] = mapped_column(String(32), primary_key=True)


class UtilizationSample(Base):
    """The cluster's capacity, allocation and use at a moment (utilization.py's figures): one
    sample per interval (`level` 0), averaged into buckets once older than the detail period
    (`level` 1), dropped after the retention (utilization_store.py). Memory in bytes."""

    __tablename__ = "utilization_samples"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True), nullable=False)
    level: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    seconds: Mapped[float] = mapped_column(Float, nullable=False)
    cpu_capacity: Mapped[float | None] = mapped_column(Float, nullable=True)
    cpu_allocated: Mapped[float | None] = mapped_column(Float, nullable=True)
    cpu_used: Mapped[float | None] = mapped_column(Float, nullable=True)
    mem_capacity: Mapped[float | None] = mapped_column(Float, nullable=True)
    mem_allocated: Mapped[float | None] = mapped_column(Float, nullable=True)
    mem_used: Mapped[float | None] = mapped_column(Float, nullable=True)
    fgpu_capacity: Mapped[float | None] = mapped_column(Float, nullable=True)
    fgpu_allocated: Mapped[float | None] = mapped_column(Float, nullable=True)
    fgpu_used: Mapped[float | None] = mapped_column(Float, nullable=True)

    __table_args__ = (Index("ix_utilization_samples_at", "at"),)


def request_view(record: SessionRecord) -> dict:
    """What a session is and asked for, as every view of it (queue, history) begins."""
    return {
        "id": record.id,
        "user": record.user,
        "server_name": record.server_name,
        "status": record.status,
        "image": record.image,
        "cpu": record.cpu,
        "mem": record.mem,
        "fgpu": record.fgpu,
        "resource_group": record.resource_group,
        "type": "batch" if record.job_json else "interactive",
        "job": json.loads(record.job_json) if record.job_json else None,
        "exit_code": record.exit_code,
    }


class FolderRecord(Base):
    """A storage folder (folders.py): its name, its owner's account, and its last measure. Its
    files are the directory named by its id under the folders root (folder_files.py)."""

    __tablename__ = "folders"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(64), nullable=False)
    owner: Mapped[str] = mapped_column(String(255), nullable=False)
    #: The owner's hub account (accounts.py): a later user of the same name is not the owner.
    account: Mapped[str] = mapped_column(String(32), nullable=False, default="")
    created: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    size_bytes: Mapped[int] = mapped_column(BigInteger, nullable=False, default=0)
    files: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    modified: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    # Removed: when, and the name its directory was kept under for the grace period.
    deleted: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    trash_name: Mapped[str | None] = mapped_column(String(64), nullable=True)

    __table_args__ = (Index("ix_folders_owner", "owner", "account"),)


class StorageProject(Base):
    """The kernel project id of an owner account's folders, where project quotas hold the
    storage quota (project_quotas.py): one id per account, never given to another."""

    __tablename__ = "storage_projects"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    owner: Mapped[str] = mapped_column(String(255), nullable=False)
    account: Mapped[str] = mapped_column(String(32), nullable=False, default="")

    __table_args__ = (Index("ix_storage_projects_owner", "owner", "account", unique=True),)


class FolderShare(Base):
    """A folder shared with one user account or one hub group, read-only or read-write."""

    __tablename__ = "folder_shares"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    folder_id: Mapped[str] = mapped_column(String(32), nullable=False)
    user: Mapped[str | None] = mapped_column(String(255), nullable=True)
    # The user's account when shared: the share ends with that account.
    account: Mapped[str] = mapped_column(String(32), nullable=False, default="")
    group: Mapped[str | None] = mapped_column(String(255), nullable=True)
    permission: Mapped[str] = mapped_column(String(2), nullable=False)
    created: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    __table_args__ = (
        Index("ix_folder_shares_folder", "folder_id"),
        Index("ix_folder_shares_user", "user"),
        Index("ix_folder_shares_group", "group"),
    )


class SessionMount(Base):
    """A storage folder a session mounts, as resolved when its spawn asked (folders.py): shown
    with the session's record."""

    __tablename__ = "session_mounts"

    session_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    path: Mapped[str] = mapped_column(String(128), primary_key=True)
    folder_id: Mapped[str] = mapped_column(String(32), nullable=False)
    name: Mapped[str] = mapped_column(String(64), nullable=False)
    owner: Mapped[str] = mapped_column(String(255), nullable=False)
    read_only: Mapped[bool] = mapped_column(Boolean, nullable=False)
    note: Mapped[str] = mapped_column(Text, nullable=False, default="")


class SSHKey(Base):
    """A public key that logs its owner's account in over SSH (queue_service/ssh/): the owner or
    an admin adds it (`api/ssh-keys`); it ends with the account."""

    __tablename__ = "ssh_keys"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    owner: Mapped[str] = mapped_column(String(255), nullable=False)
    account: Mapped[str] = mapped_column(String(32), nullable=False, default="")
    #: The key's SHA256 fingerprint, as `ssh-keygen -l` shows it: how a login finds it.
    fingerprint: Mapped[str] = mapped_column(String(64), nullable=False)
    key: Mapped[str] = mapped_column(Text, nullable=False)
    title: Mapped[str] = mapped_column(String(255), nullable=False, default="")
    created: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    __table_args__ = (
        Index("ix_ssh_keys_fingerprint", "fingerprint"),
        Index("ix_ssh_keys_owner", "owner", "account"),
    )
