"""``gctestbed verify``: every method on a small shaped job next to ``none``, against its contract.

Each method trains the same small model on the same shaped nodes; its recorded exchanges are held
against the contract its paper sets (gctestbed.contracts) and the bytes the nodes' interfaces
counted. A method passes when, on every judged step of every node: each parameter went out once
(as many exchanges as ``none`` makes), every bucket took the rounds and collectives its contract
names, the elements it chose lie within the paper's bounds, its payload is the contract's size
term by term, the interface counters lie between the contract's bytes and those plus headers,
and the replicas end bit-identical. Over parameter servers (``--comm ps``) each worker's pushes
are judged the same way part by part, and the servers' interfaces, over the whole run, must have
taken in every push and sent out every pull (contracts.judge_ps).

A method whose contract changes with the step (contracts.phases: DGC's warm-up epochs and the steps
after them, PowerSGD's dense start and its compressed steps) is judged in every phase, whatever
options were typed: a schedule option left out is set short (SCHEDULE) so that each phase has a
judged step, the run is as long as the last phase needs, and the report lists the steps judged
in each phase. Typed options that put a whole phase in DDP's first two steps, which are never
judged, or past MAX_STEPS, are refused.
"""

from __future__ import annotations

import math
from typing import Callable

from . import contracts, flags, results, runner
from .launch.kept import kept_for
from .spec import SpecError, parse_choice

MODEL = "mlp:width=512,depth=2,input_dim=512"     # 530,442 parameters: 2.1 MB of fp32 gradient per step
BUCKET_CAP_MB = "1"
STEPS = 8
# Schedule options set where they were not typed, short enough that a short job judges every phase
# (the first judged step is contracts.FIRST_JUDGED = 2): DGC's four warm-up epochs of 3 steps
# (steps 2, 3-5, 6-8, 9-11) and its final density from step 12; PowerSGD's dense start at steps 2-3
# and its compressed steps from 4.
SCHEDULE = {"dgc": {"steps_per_epoch": 3}, "powersgd": {"start_iter": 4}}
LAST_PHASE_STEPS = 2       # judged steps at least in a method's last phase
MAX_STEPS = 100            # a schedule that needs more is refused (typed options can ask for any length)


def scheduled(text: str) -> str:
    """``text`` with SCHEDULE's options added where it does not set them: 'dgc' -> 'dgc:steps_per_epoch=3'."""
    name, raw = parse_choice(text, "compressor")
    added = [f"{k}={v}" for k, v in SCHEDULE.get(name, {}).items() if k not in raw]
    return text if not added else text + ("," if raw else ":") + ",".join(added)


def steps_for(text: str, steps: int) -> int:
    """Steps the method's run needs to judge each of its phases (at least ``steps``); a phase that
    lies wholly before the first judged step, or a schedule longer than MAX_STEPS: one SpecError."""
    from . import compress
    name, options = compress.resolve(text)
    schedule = contracts.phases(name, options)
    for phase in schedule:
        if phase.last is not None and phase.last < contracts.FIRST_JUDGED:
            where = f"step {phase.first}" if phase.first == phase.last else f"steps {phase.first}-{phase.last}"
            raise SpecError(f"'{text}' puts its {phase.name} in {where}, which verify cannot "
                            f"judge (DDP's first {contracts.FIRST_JUDGED} steps never are): lengthen it, or leave the "
                            f"option out and verify sets {name}'s schedule itself.")
    need = max(steps, schedule[-1].first + LAST_PHASE_STEPS, contracts.FIRST_JUDGED + LAST_PHASE_STEPS)
    if need > MAX_STEPS:
        raise SpecError(f"'{text}' needs {need} steps to reach every phase of its schedule, more than verify's "
                        f"{MAX_STEPS}: shorten it, or leave its schedule options out and verify sets them.")
    return need


def methods_from(texts: tuple[str, ...] | list[str], comm: str = "allreduce", steps: int = STEPS) -> list[str]:
    """``--compressor`` values ('M;M...' or repeated) -> the method texts verify runs (SCHEDULE's
    options added where not typed); none given: every method (every one ``comm`` can carry). A
    method ``comm`` refuses, or whose phases cannot all be judged: its sentence."""
    from . import compress
    given = [part.strip() for text in texts for part in text.split(";") if part.strip()]
    chosen = [scheduled(text) for text in (given or compress.names())]
    carried = []
    for text in chosen:
        compress.resolve(text)                    # an unknown method or option: one SpecError now
        steps_for(text, steps)
        try:
            flags.build_spec(compressor=text, comm=comm)
        except SpecError:
            if given:
                raise
            continue                              # all methods: those this scheme cannot carry are left out
        carried.append(text)
    return carried


def model_parameters(workload: str = MODEL) -> list[tuple[str, int]]:
    """The model's parameters, names and sizes in its order, read from the model itself (not from
    anything a run recorded)."""
    from . import workloads
    name, options = flags.resolve_workload(workload)
    work = workloads.build(name, options, seed=0, rank=0, batch_size=32, world=1)
    return [(n, p.numel()) for n, p in work.model.named_parameters()]


def run(methods: list[str], nodes: int = 2, bw: str = "1gbit", steps: int = STEPS, results_dir: str = "results/verify",
        on_phase: Callable[[str], None] = lambda text: None, comm: str = "allreduce") -> dict:
    """Run ``none`` and every method (over ``comm``: the ring, or parameter servers, whose
    contract adds the servers' links); the report, one row per method, ``ok`` when all pass."""
    params = model_parameters()
    numel, order = sum(n for _, n in params), ["module." + name for name, _ in params]   # as DDP's wrapper names them
    rows, base = [], None
    with kept_for("verify") as kept:          # one network and one fork server for every method's run, as a sweep's
        for text in dict.fromkeys(["none", *methods]):        # none first: every method is set beside it
            on_phase(text)
            spec = flags.build_spec(nodes=str(nodes), bw=bw, latency="0", compressor=text, workload=MODEL,
                                    steps=str(steps_for(text, steps)),
                                    batch_size="32", lr="0.05", seed="0", bucket_cap_mb=BUCKET_CAP_MB, timeout="120s",
                                    results_dir=results_dir, calibrate=False, comm=comm)
            summary = runner.run(spec, kept=kept)
            conn = results.connect(results_dir)
            try:
                check = results.contract_check(conn, summary.run_id, spec, numel, order)
            finally:
                conn.close()
            row = judge_row(text, summary, check, base, spec.steps)
            base = base or row
            if text in methods:
                rows.append(row)
    return {"nodes": nodes, "bw": bw, "steps": steps, "workload": MODEL, "model_numel": numel, "comm": comm,
            "none": base, "methods": rows, "ok": bool(rows) and all(r["ok"] for r in rows) and base["ok"]}


def judge_row(text: str, summary: results.RunSummary, check: dict | None, base: dict | None, steps: int) -> dict:
    """One method's verdict from its run's summary and contract check, beside ``none``'s row: a
    phase of its schedule in which no step was judged is a problem too."""
    problems = list(check["problems"]) if check else [_problem("exchanges", "the run recorded no exchanges")]
    for phase in (check["phases"] if check else []):
        if not phase["steps_judged"]:
            problems.append(_problem("phases", f"no step of its {phase['phase']} was judged"))
    if summary.status != "ok":
        problems.insert(0, _problem("run", f"the run failed: {summary.error}"))
    if summary.params_identical is not True:
        problems.append(_problem("replicas", "the replicas did not end bit-identical"))
    exchanges = check["exchanges_per_step"] if check else None
    if base is not None and exchanges != base["exchanges_per_step"]:
        problems.append(_problem("exchanges", f"{exchanges:g} exchanges per step where none makes "
                                              f"{base['exchanges_per_step']:g}"))
    counters = check["counters_bytes"] if check else None
    reference = base["counters_bytes"] if base else counters          # none's own row: 1
    return {"method": text, "run_id": summary.run_id,
            "contract_bytes": check["contract_wire_bytes"] if check else None, "counters_bytes": counters,
            "ratio_to_none": counters / reference if counters and reference else None,
            "payload_bytes": check["accounting_bytes"] if check else None,
            "exchanges_per_step": exchanges, "collectives_per_step": check["collectives_per_step"] if check else None,
            "sent_fraction": check["sent_fraction"] if check else None, "steps": steps,
            "steps_judged": check["steps_judged"] if check else [], "phases": check["phases"] if check else [],
            "params_identical": summary.params_identical, "servers": check.get("servers") if check else None,
            "ok": not problems, "problems": problems}


def _problem(term: str, text: str) -> dict:
    return {"term": term, "step": None, "node": None, "text": text}


def fmt_bytes(n: float | None) -> str:
    if n is None or (isinstance(n, float) and math.isnan(n)):
        return "-"
    for unit, size in (("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.4g} {unit}"
    return f"{n:.0f} B"
