"""One module per contender; each runs as its own process: `python -m benchmarks.contenders.<name>`.

Separate processes keep every contender's imports, threads and launch cost its own (Lightning's
"ddp" re-runs the command line for the other ranks, which needs a real entry point anyway).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Contender:
    name: str
    label: str
    module: str
    options: dict[str, str] = field(default_factory=dict)
    distributed: bool = True


def _by_name(*contenders: Contender) -> dict[str, Contender]:
    return {contender.name: contender for contender in contenders}


CONTENDERS: dict[str, Contender] = _by_name(
    Contender("single", "1 process, no DDP", "benchmarks.contenders.single", distributed=False),
    Contender("torch_ddp", "torch DDP, hand-written loop", "benchmarks.contenders.torch_ddp"),
    Contender("pl_ddp", "Lightning Trainer, strategy=\"ddp\"", "benchmarks.contenders.pl_ddp"),
    Contender("ours", "our Trainer + DDPStrategy", "benchmarks.contenders.ours"),
    Contender("pl_ours", "Lightning Trainer + our LightningDDPStrategy", "benchmarks.contenders.pl_ours"),
    Contender("ours_bf16", "our Trainer + DDPStrategy(comm_hook=\"bf16\")", "benchmarks.contenders.ours",
              {"comm_hook": "bf16"}),
    # Ours with gloo carrying the buckets, as torch DDP does: what the shared-memory transport buys.
    Contender("ours_gloo", "our Trainer + DDPStrategy(transport=\"process_group\")", "benchmarks.contenders.ours",
              {"transport": "process_group"}),
)
# torch.compile'd contenders (inductor), run when asked for (--contenders ...): compiling costs
# minutes on a 2-core CPU, so the default run leaves them out.
COMPILED: dict[str, Contender] = _by_name(
    Contender("torch_ddp_compiled", "torch DDP + torch.compile", "benchmarks.contenders.torch_ddp",
              {"compile": "inductor"}),
    Contender("ours_compiled", "our Trainer + DDPStrategy, torch.compile'd module", "benchmarks.contenders.ours",
              {"compile": "inductor"}),
    Contender("pl_ddp_compiled", "Lightning ddp, torch.compile'd module", "benchmarks.contenders.pl_ddp",
              {"compile": "inductor"}),
    Contender("single_compiled", "1 process, torch.compile", "benchmarks.contenders.single",
              {"compile": "inductor"}, distributed=False),
)

# ZeRO-1 and -2 (optimizer state, then gradients, sharded over the ranks: strategies/zero.py), run when asked
# for: against "ours".
ZERO: dict[str, Contender] = _by_name(
    Contender("ours_zero1", "our Trainer + DDPStrategy(zero_stage=1)", "benchmarks.contenders.ours",
              {"zero_stage": "1"}),
    Contender("ours_zero2", "our Trainer + DDPStrategy(zero_stage=2)", "benchmarks.contenders.ours",
              {"zero_stage": "2"}),
)

# What two of our Trainer's defaults cost (the non-finite check reads every gradient once a step;
# telemetry times the buckets), run when asked for: against "ours" and "pl_ours" (#37: ours >= pl_ours).
DEFAULTS_PRICED: dict[str, Contender] = _by_name(
    Contender("ours_nocheck", "our Trainer, on_nonfinite=\"ignore\"", "benchmarks.contenders.ours",
              {"on_nonfinite": "ignore"}),
    Contender("ours_bare", "our Trainer, on_nonfinite=\"ignore\", no TelemetryMonitor", "benchmarks.contenders.ours",
              {"on_nonfinite": "ignore", "telemetry": "off"}),
)

BASELINE = "torch_ddp"
ALL_CONTENDERS: dict[str, Contender] = {**CONTENDERS, **COMPILED, **ZERO, **DEFAULTS_PRICED}
