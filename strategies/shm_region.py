"""The shared-memory transport's region: one file in /dev/shm that every rank of a host maps.

Its layout is, per rank, `[flags page | data slot]`; rank 0's flags page also carries a random
token, so a rank that opened a different file of the same name (a separate /dev/shm, as in some
containers) notices. Everything here that can fail returns an `Obstacle` instead of raising: the
caller (`shm_transport.connect_shared_memory`, a collective) must let every rank reach the same
verdict, so no rank is left waiting in a collective the others skipped.
"""

from __future__ import annotations

import mmap
import os
import platform
import secrets
import socket

SHM_DIR_ENV = "DDP_TRAINER_SHM_DIR"  # where the region file lives; /dev/shm unless set (tests)
FLAGS_BYTES = 4096  # one page: the flags never share a cache line with gradient data
# Words of a rank's flags page. SHAPE (element count and dtype of the round) is written before
# READY, so peers can refuse a round whose tensors differ instead of summing garbage; FAILED lets a
# rank that hit an error stop its peers at once instead of after the timeout. NONFINITE counts the rounds
# whose share, as this rank summed it, held a NaN or inf (written before REDUCED, so a peer past REDUCED sees it).
READY, REDUCED, DONE, TOKEN, SHAPE, FAILED, NONFINITE = 0, 1, 2, 3, 4, 5, 6


class Obstacle(str):
    """Why one rank cannot use shared memory (a str, so it pickles through all_gather_object)."""


def host_identity() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as file:
            boot = file.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


def shm_dir() -> str:
    return os.environ.get(SHM_DIR_ENV, "/dev/shm")


def local_obstacle(needed_bytes: int) -> Obstacle | None:
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return Obstacle(f"{platform.machine()} is not x86-64 (the flags rely on x86's store order)")
    directory = shm_dir()
    if not os.path.isdir(directory):
        return Obstacle(f"{directory} does not exist")
    try:
        stats = os.statvfs(directory)
    except OSError as error:
        return Obstacle(f"cannot read the free space of {directory}: {error}")
    free = stats.f_bavail * stats.f_frsize
    if free < 2 * needed_bytes:
        return Obstacle(f"{directory} has {free / 2**20:.0f} MiB free, fewer than twice the "
                        f"{needed_bytes / 2**20:.0f} MiB needed")
    return None


def first_obstacle(reports: list[tuple[str, Obstacle | None]]) -> Obstacle | None:
    for rank, (_, obstacle) in enumerate(reports):
        if obstacle is not None:
            return Obstacle(f"rank {rank}: {obstacle}")
    hosts = {host for host, _ in reports}
    if len(hosts) > 1:
        return Obstacle(f"the ranks run on {len(hosts)} hosts")
    return None


def create_region(world_size: int, slot_bytes: int) -> tuple[str, int] | Obstacle:
    """Rank 0: create and reserve the file (so a full /dev/shm fails here, not as a SIGBUS later)."""
    token = secrets.randbits(62)
    path = os.path.join(shm_dir(), f"ddp_trainer_grads_{os.getpid()}_{token:x}")
    size = region_bytes(world_size, slot_bytes)
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.posix_fallocate(fd, 0, size)
            os.pwrite(fd, token.to_bytes(8, "little"), TOKEN * 8)  # rank 0's flags page carries the token
        finally:
            os.close(fd)
    except Exception as error:  # noqa: BLE001 - any failure becomes a reason every rank hears
        unlink_quietly(path)
        return Obstacle(f"rank 0 could not create {path}: {type(error).__name__}: {error}")
    return path, token


def open_region(created: tuple[str, int], rank: int, world_size: int,
                 slot_bytes: int) -> tuple[mmap.mmap | None, Obstacle | None]:
    path, token = created
    size = region_bytes(world_size, slot_bytes)
    try:
        fd = os.open(path, os.O_RDWR)
        try:
            region = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
    except Exception as error:  # noqa: BLE001 - any failure becomes a reason every rank hears
        return None, Obstacle(f"rank {rank} could not map {path}: {type(error).__name__}: {error}")
    if int.from_bytes(region[TOKEN * 8:TOKEN * 8 + 8], "little") != token:
        region.close()
        return None, Obstacle(f"rank {rank} sees another {path} (a separate /dev/shm?)")
    return region, None


def region_bytes(world_size: int, slot_bytes: int) -> int:
    """The file's size: one flags page and one slot per rank."""
    return world_size * (FLAGS_BYTES + slot_bytes)


def unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
