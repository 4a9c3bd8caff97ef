"""One contender's process: `python -m benchmarks.gpu.worker --loop ours --accelerator cuda ...`.

It lives for the whole benchmark and trains one stretch per (workload, mode) when the coordinator
says `start`, pausing inside its loop whenever the session waits for a command. Its own stdout is
the protocol stream; anything a library prints goes to stderr (the coordinator's log file).
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import traceback
from typing import Any

import torch

from benchmarks.gpu.loops import LOOPS
from benchmarks.gpu.models import workloads
from benchmarks.gpu.session import Channel, Session


def _protocol_channel() -> Channel:
    """Keep the real stdout for answers; point fd 1 (print, C libraries) at stderr."""
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    return Channel(sys.stdin, answers)


def _device(accelerator: str) -> torch.device:
    if accelerator == "cuda":
        torch.cuda.set_device(0)
        return torch.device("cuda", 0)
    return torch.device("cpu")


def _stretch(args: argparse.Namespace, channel: Channel, device: torch.device, command: dict[str, Any]) -> None:
    """Train one workload in one mode until the coordinator ends it; answer how it ended."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    session = Session(channel, device)
    try:
        work = workloads(args.smoke)[command["workload"]]
        LOOPS[args.loop](work, device, args.precision, command["mode"] == "compiled", session)
    except Exception:  # the coordinator records it and goes on with the other contenders
        channel.send({"error": traceback.format_exc()[-4000:]})
        return
    if not session.finished:
        channel.send({"error": f"{args.loop}'s training loop stopped after {session.steps} steps "
                               "before the coordinator ended it"})
        return
    loss = session.last_loss
    channel.send({"ended": True, "steps": session.steps, "final_loss": float(loss.detach()) if loss is not None
                  else None, "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30
                  if device.type == "cuda" else None})


def _release(device: torch.device) -> None:
    """Drop the last stretch's model, optimizer and compiled code before the next one starts."""
    gc.collect()
    torch._dynamo.reset()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--loop", choices=sorted(LOOPS), required=True)
    parser.add_argument("--accelerator", choices=("cpu", "cuda"), required=True)
    parser.add_argument("--precision", choices=("32-true", "bf16-mixed"), required=True)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    channel = _protocol_channel()
    device = _device(args.accelerator)
    channel.send({"alive": True, "pid": os.getpid(), "torch": torch.__version__})
    while True:
        command = channel.receive()
        if command["cmd"] != "start":
            break
        _stretch(args, channel, device, command)
        _release(device)


if __name__ == "__main__":
    main()
