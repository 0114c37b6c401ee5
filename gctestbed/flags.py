"""From what users type to a RunSpec: flags parsed, checked and resolved, shared by run and sweep.

Every value arrives as the text the user typed; each mistake becomes one SpecError sentence
naming the accepted forms.
"""

from __future__ import annotations

import json
import os

from . import topofile, tracefile
from .spec import (LinkSpec, RunSpec, SpecError, UserError, format_duration, parse_choice, parse_duration, parse_fault,
                   parse_percent, parse_rate, resolve_options)


def _typed(name: str) -> str:
    """RunSpec's default of ``name`` as a user would type it."""
    value = RunSpec.default(name)
    if name == "timeout_s":
        return format_duration(value)
    return f"{value:g}" if isinstance(value, float) else str(value)


# Every default a flag has, as typed: the network's here (a RunSpec always has its nodes and
# link), the rest read from RunSpec's fields. run, node, sweep, up and calibrate all read these.
DEFAULTS: dict[str, str] = {
    "nodes": "2", "bw": "1gbit", "latency": "0", "jitter": "0", "loss": "0",
    **{flag: _typed(field) for flag, field in (
        ("latency_impl", "latency_impl"), ("compressor", "compressor"), ("workload", "workload"), ("steps", "steps"),
        ("batch_size", "batch_size"), ("lr", "lr"), ("seed", "seed"), ("bucket_cap_mb", "bucket_cap_mb"),
        ("timeout", "timeout_s"), ("results_dir", "results_dir"), ("kernels", "kernels"), ("mode", "mode"),
        ("launcher", "launcher"), ("backend", "backend"), ("device", "device"), ("optimizer", "optimizer"),
        ("eval_every", "eval_every"), ("comm", "comm"), ("cpus_per_node", "cpus_per_node"), ("dilate", "dilate"))},
}


def build_spec(*, nodes=DEFAULTS["nodes"], bw=DEFAULTS["bw"], latency=DEFAULTS["latency"],
               compressor=DEFAULTS["compressor"], workload=DEFAULTS["workload"], steps=DEFAULTS["steps"],
               batch_size=DEFAULTS["batch_size"], lr=DEFAULTS["lr"], seed=DEFAULTS["seed"],
               bucket_cap_mb=DEFAULTS["bucket_cap_mb"], timeout=DEFAULTS["timeout"], results_dir=DEFAULTS["results_dir"],
               bw_down=None, jitter=DEFAULTS["jitter"], loss=DEFAULTS["loss"], latency_impl=DEFAULTS["latency_impl"],
               topology_file=None, calibrate=True, accept_miss=False, kernels=DEFAULTS["kernels"],
               mode=DEFAULTS["mode"], command=(), launcher=DEFAULTS["launcher"], faults=(),
               backend=DEFAULTS["backend"], device=DEFAULTS["device"], optimizer=DEFAULTS["optimizer"],
               eval_every=DEFAULTS["eval_every"], comm=DEFAULTS["comm"], cpus_per_node=DEFAULTS["cpus_per_node"],
               dilate=DEFAULTS["dilate"], run_id="", replay=None) -> RunSpec:
    """Everything typed on the command line, parsed and checked, as a RunSpec."""
    from . import comm as comms, compress, optimizers      # (torch: here, not for every command that imports flags)
    if replay:
        if command or workload != DEFAULTS["workload"]:
            raise SpecError("--replay TRACE is the workload: leave out --workload and '-- CMD'.")
        workload = replay_workload(replay)
    comp_name, comp_options = compress.resolve(compressor)
    trace = None
    if not command:
        wl_name, wl_options = resolve_workload(workload)
        if wl_name == "replay":
            trace = _trace(wl_options, comp_name, comp_options)
            if wl_options["codec"] == "recorded":
                comp_name, comp_options = _recorded_method(trace, compressor, comp_name, comp_options)
    opt_name, opt_options = optimizers.resolve(optimizer)
    method = compress.create(comp_name, comp_options, kernels="torch")
    optimizers.check(opt_name, comp_name, method.momentum_inside, opt_options, method.clips_locally)
    comm_name, comm_options = comms.resolve(comm)
    comms.check(comm_name, comm_options, method, backend, own_loop=not command)
    if trace is not None:
        bucket_cap_mb, batch_size = _replayable(trace, wl_options, steps, bucket_cap_mb, comm_name, comm_options, method.needs_own_loop(),
                                    _int("--nodes", nodes), batch_size)
        _replay_clock(trace, wl_options, device)
    if method.reads_batch and _int("--batch-size", batch_size) < 2:
        raise SpecError(f"{comp_name} reads the variance of each node's batch: --batch-size must be at least 2.")
    if command:                     # the user's own program is the workload
        wl_name, wl_options = "command", {"argv": list(command)}
        if mode != "overlap":
            raise SpecError("--mode serial times gctestbed's own training loop: with '-- CMD' only overlap is possible.")
        if method.needs_own_loop():
            raise SpecError(f"{comp_name} needs per-sample or per-micro-batch statistics from gctestbed's own loop: "
                            "use it with a built-in or pkg.module:function workload, not '-- CMD'.")
    link = LinkSpec(bw_bps=parse_rate(bw), latency_s=parse_duration(latency), jitter_s=parse_duration(jitter, "--jitter"),
                    loss_pct=parse_percent(loss, "--loss"), bw_down_bps=parse_rate(bw_down) if bw_down else None)
    topo = None
    path = topofile.locate(topology_file) if topology_file else None
    if path is not None:
        topo = topofile.load(path)
        nodes = str(len(topo.nodes) - (comm_options["servers"] if comm_name == "ps" else 0))   # servers come last
    spec = RunSpec(nodes=_int("--nodes", nodes), link=link, topology=topo, latency_impl=latency_impl,
                   calibrate=calibrate, accept_miss=accept_miss,
                   compressor=comp_name, compressor_options=comp_options, workload=wl_name, workload_options=wl_options,
                   steps=_int("--steps", steps), batch_size=_int("--batch-size", batch_size), lr=_float("--lr", lr),
                   seed=_int("--seed", seed), optimizer=opt_name, optimizer_options=opt_options,
                   eval_every=_int("--eval-every", eval_every), bucket_cap_mb=_float("--bucket-cap-mb", bucket_cap_mb),
                   timeout_s=parse_duration(timeout, "--timeout"), results_dir=results_dir, kernels=kernels,
                   mode=mode, command=list(command), launcher=launcher, faults=[parse_fault(f) for f in faults],
                   backend=backend, device=device, comm=comm_name, comm_options=comm_options,
                   cpus_per_node=_float("--cpus-per-node", cpus_per_node), run_id=run_id,
                   dilate=_dilation(dilate, workload, wl_name, wl_options))
    spec.validate()
    return spec


def replay_workload(text: str) -> str:
    """``--replay TRACE[,key=value,...]`` as the workload it stands for: ``replay:trace=TRACE,...``."""
    text = text.strip()
    return f"replay:{text}" if text.startswith("trace=") else f"replay:trace={text}"


def _trace(options: dict, method: str = "", method_options: dict | None = None) -> dict:
    """The replay's trace, read and checked (options["trace"] made the absolute path of one file:
    nodes read it from anywhere); one sentence when it cannot be replayed. A directory stands for
    its trace recorded with the run's method (``method``, its options resolved), so a sweep over
    methods replays each method's own trace of one model (``sweep --record-traces DIR`` writes one
    per method)."""
    path = tracefile.path_of(options["trace"])
    if os.path.isdir(path):
        path = _of_method(path, method, method_options or {})
    try:
        trace = tracefile.load(path)
    except UserError as e:
        raise SpecError(str(e)) from None
    options["trace"] = path
    if not trace.get("ranks") or not all(r["steps"] for r in trace["ranks"]):
        raise SpecError(f"trace {path} holds no recorded steps: record a run that trained.")
    if any(b.get("ready_s") is None for r in trace["ranks"] for s in r["steps"] for b in s["buckets"]):
        raise SpecError(f"trace {path} has buckets without ready times (a run stored before schema 13): "
                        "run the job again with this gctestbed and trace that run.")
    return trace


# what one job's traces share whatever their method: a directory of them stands for one job
ONE_JOB = ("workload", "workload_options", "nodes", "batch_size", "bucket_cap_mb", "mode", "comm", "comm_options",
           "optimizer")


def _of_method(directory: str, method: str, options: dict) -> str:
    """The one trace in ``directory`` recorded with ``method`` and ``options``; one sentence when
    there is none or more than one."""
    held, found, jobs = [], [], {}
    for path, trace in tracefile.in_dir(directory):
        job = trace["job"]
        jobs.setdefault(json.dumps([{k: job.get(k) for k in ONE_JOB}, trace.get("recorded", {}).get("device")],
                                   sort_keys=True), os.path.basename(path))
        recorded = job.get("compressor_options") or {}
        held.append(job["compressor"] + (":" + ",".join(f"{k}={v}" for k, v in sorted(recorded.items())) if recorded else ""))
        if (job["compressor"], recorded) == (method, options):
            found.append(path)
    if len(jobs) > 1:
        raise SpecError(f"{directory} holds traces of different jobs or devices ({', '.join(jobs.values())} differ): a "
                        "directory stands for one job's traces, one per method; name one file.")
    if len(found) == 1:
        return found[0]
    if found:
        raise SpecError(f"{directory} holds {len(found)} traces of {method} with these options "
                        f"({', '.join(os.path.basename(f) for f in found)}): name one file.")
    raise SpecError(f"{directory} holds no trace of {method}"
                    + (f" with options {', '.join(f'{k}={v}' for k, v in sorted(options.items()))}" if options else "")
                    + (f"; it holds: {'; '.join(held)}." if held else ", nor any other trace."))


def _recorded_method(trace: dict, typed: str, name: str, options: dict) -> tuple[str, dict]:
    """With codec=recorded the payloads are the trace's, so the method is: the trace's when
    --compressor is left at its default (even when typed as such), else it must be the same."""
    recorded = trace["job"]["compressor"], trace["job"]["compressor_options"]
    if typed.strip() == DEFAULTS["compressor"]:
        return recorded
    if (name, options) != recorded:
        raise SpecError(f"codec=recorded replays the trace's {recorded[0]} payloads: leave out --compressor, or "
                        "use codec=real to run another method on the trace's compute.")
    return recorded


def _replayable(trace: dict, options: dict, steps, bucket_cap_mb, comm: str, comm_options: dict, own_loop: bool, nodes: int,
                batch_size):
    """Check a replay against its trace; the bucket cap the trace's DDP used and the batch it
    replays where none was typed (left at the default, even typed as such). One sentence otherwise."""
    from . import workloads
    recorded = min(len(r["steps"]) for r in trace["ranks"])
    if _int("--steps", steps) > recorded:
        raise SpecError(f"the trace holds {recorded} steps: replay at most that many (--steps {recorded}).")
    if comm not in workloads.replay.COMMS or own_loop:
        raise SpecError("replay runs over the ring or parameter servers (--comm allreduce or ps) with a method that "
                        "reads nothing of the batch but its gradient (not variance or hybrid), for now.")
    recorded_comm = trace["job"].get("comm", "allreduce")
    pushed = comm == "ps" and recorded_comm == "allreduce" and one_round(trace)
    if options["codec"] == "recorded" and comm != recorded_comm and not pushed:
        raise SpecError(f"codec=recorded sends what the trace's ranks sent over --comm {recorded_comm}: "
                        "replay it over the same --comm (or over --comm ps a ring's trace whose buckets each sent one "
                        "payload), or use codec=real.")
    recorded_ps = ((trace["job"].get("comm_options") or {}) if recorded_comm == "ps"
                   else dict(comm_options, servers=1, pull="dense"))
    if options["codec"] == "recorded" and comm == "ps" and (
            comm_options != recorded_ps or recorded_ps.get("servers") != 1 or recorded_ps.get("pull") != "dense"):
        raise SpecError("codec=recorded replays parameter servers of one server with dense pulls, the trace's own or a "
                        "ring's trace pushed, for now (pushes split over servers or pulled compressed are not replayed): "
                        "use codec=real.")
    if options["real"] and options["codec"] == "recorded":
        raise SpecError("a mixed run's real ranks run the method for real, so the replaying ranks must too: "
                        "leave out codec=recorded when real=N.")
    if options["real"] and options["optim"] == "recorded":
        raise SpecError("a mixed run's replicas stay equal only if every rank updates its model: leave out "
                        "optim=recorded when real=N.")
    if options["optim"] == "recorded" and any(s.get("optim_s") is None for r in trace["ranks"] for s in r["steps"]):
        raise SpecError(f"optim=recorded waits the trace's optimizer times, and trace {options['trace']} lacks some.")
    if options["real"]:
        job = trace["job"]
        if job["workload"] not in workloads.names() or job["workload"] == "replay":
            raise SpecError(f"real={options['real']} runs the recorded model, but the trace's workload "
                            f"({job['workload']}) is not a built-in one gctestbed can build.")
        if options["real"] > nodes:
            raise SpecError(f"real={options['real']} asks for more real ranks than --nodes {nodes}.")
        if str(batch_size) != str(DEFAULTS["batch_size"]) and _int("--batch-size", batch_size) != job["batch_size"]:
            raise SpecError(f"a mixed run's real ranks train the recorded job: use its --batch-size {job['batch_size']}.")
    if str(batch_size) == str(DEFAULTS["batch_size"]) and trace["job"].get("batch_size"):
        batch_size = str(trace["job"]["batch_size"])      # the batch whose compute is replayed
    from . import profiler_import
    if (why := profiler_import.replayable_here(trace)) is not None:
        raise SpecError(why)
    cap = trace["job"]["bucket_cap_mb"]
    if str(bucket_cap_mb) == str(DEFAULTS["bucket_cap_mb"]):
        return cap, batch_size
    if _float("--bucket-cap-mb", bucket_cap_mb) != cap:
        raise SpecError(f"the trace's DDP used --bucket-cap-mb {cap:g}: a replay must form the same buckets.")
    return bucket_cap_mb, batch_size


def one_round(trace: dict) -> bool:
    """Whether every recorded bucket sent one payload in one round (an all-reduce or an all-gather of
    what the rank encoded, not PowerSGD's two rounds): what a worker pushes to one parameter server
    is then that payload, so a ring's trace replays over --comm ps with codec=recorded, the pulls
    dense and the server's own work real."""
    from .compress.recorded import rounds_of
    return all(len(rounds_of(b)) == 1 for r in trace["ranks"] for s in r["steps"] for b in s["buckets"])


def _replay_clock(trace: dict, options: dict, device: str) -> None:
    """A spin's clock settled before any node starts, and written into the options so the run's
    spec says which it waited on (workloads/replay.py's clock): on a GPU the wall clock (backward
    runs on a thread of the GPU's, not forward's, so one thread's CPU seconds would not count the
    step's), clock=cpu refused there; elsewhere the CPU clock where the trace has every CPU time
    the replay waits, else the wall clock, and clock=cpu refused where it lacks one. One sentence
    either way. A sleep waits wall time only: its options are left as typed."""
    from .workloads import replay
    if options["compute"] != "spin":
        return
    if device == "cuda":
        if options["clock"] == "cpu":
            raise SpecError("clock=cpu counts the CPU seconds of the thread that runs forward and backward, which on a "
                            "GPU are two threads: replay on the GPU with clock=wall.")
        options["clock"] = "wall"
        return
    try:
        options["clock"] = "cpu" if replay.cpu_clock(replay.ReplayOptions(**options), trace) else "wall"
    except UserError as e:
        raise SpecError(str(e)) from None


def _dilation(dilate, workload: str, name: str, options: dict) -> float:
    """--dilate K as a number; a replay's compute stretched by the same K (its scale option set
    to K where it was not typed; a typed scale must be K: RunSpec.validate says so)."""
    k = _float("--dilate", dilate)
    if name == "replay" and "scale" not in parse_choice(workload, "workload")[1]:
        options["scale"] = k
    return k


def resolve_workload(text: str) -> tuple[str, dict]:
    """``mlp:width=512`` -> ("mlp", typed options); ``pkg.module:function`` -> (that, {}) once it imports."""
    from . import workloads
    if workloads.is_user_code(text):
        try:
            workloads.user_function(text)
        except ValueError as e:
            raise SpecError(f"{e}; see 'gctestbed run --help' for the workload contract.") from None
        return text.strip(), {}
    name, raw = parse_choice(text, "workload")
    try:
        return name, resolve_options(f"workload '{name}'", workloads.options_class(name), raw)
    except KeyError as e:
        raise SpecError(f"{e.args[0]}.") from None


def node_counts(flag: str, text: str) -> list[int]:
    """``2,4,8`` -> [2, 4, 8], or one sentence naming the flag."""
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise SpecError(f"{flag} takes node counts separated by commas, e.g. 2,4,8; got '{text}'.") from None


def _int(flag: str, text: str) -> int:
    try:
        return int(str(text).strip())
    except ValueError:
        raise SpecError(f"{flag} must be a whole number, got '{text}'.") from None


def _float(flag: str, text: str) -> float:
    try:
        return float(str(text).strip())
    except ValueError:
        raise SpecError(f"{flag} must be a number, got '{text}'.") from None
