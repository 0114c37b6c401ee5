"""Every table and printed summary of the command line, in one place."""

from __future__ import annotations

import json

import click
from rich.console import Console
from rich.markup import escape
from rich.progress import Progress, TextColumn
from rich.table import Table

from .. import contracts, results
from .. import verify as verify_
from ..spec import format_duration, format_rate
from . import console


def verify_table(report: dict) -> Table:
    over = "" if report.get("comm", "allreduce") == "allreduce" else f" over {report['comm']}"
    table = Table(title=f"verify: {report['nodes']} nodes{over} at {report['bw']}, {report['workload']} "
                        f"({report['model_numel']:,} parameters); bytes per node per judged step")
    for col in ("method", "contract", "interface", "ratio to none", "exchanges", "collectives", "sent", "verdict"):
        table.add_column(col, justify="left" if col in ("method", "verdict") else "right")
    none_ex = report["none"]["exchanges_per_step"] if report["none"] else None
    for r in report["methods"]:
        exchanges = r["exchanges_per_step"]
        table.add_row(escape(r["method"]), verify_.fmt_bytes(r["contract_bytes"]), verify_.fmt_bytes(r["counters_bytes"]),
                      f"{r['ratio_to_none']:.3g}" if r["ratio_to_none"] else "-",
                      f"{exchanges:g} (none {none_ex:g})" if exchanges is not None and none_ex else "-",
                      f"{r['collectives_per_step']:g}" if r["collectives_per_step"] is not None else "-",
                      f"{100 * r['sent_fraction']:.3g}%" if r["sent_fraction"] is not None else "",
                      "[green]ok[/]" if r["ok"] else "[red]BROKEN[/]")
    table.caption, table.caption_justify = _phases_judged(report["methods"]), "left"
    for r in report["methods"]:
        for what, f in (r.get("servers") or {}).items():         # parameter servers: their links over the run
            ratio = f"{f['counters_bytes'] / f['contract_bytes']:.3g}x the contract" if f["contract_bytes"] else "not judged"
            table.add_row(escape(f"  {r['method']}: servers' bytes {what}"), verify_.fmt_bytes(f["contract_bytes"]),
                          verify_.fmt_bytes(f["counters_bytes"]), "", "", "", "", ratio)
        for line in contracts.describe(r["problems"]):
            table.add_row(escape(f"{r['method']} broke {line}"), "", "", "", "", "", "", "")
    return table


def _phases_judged(methods: list[dict]) -> str:
    """The steps judged in each method's phases, one line per method with several phases and one
    line for the methods of a single phase judged on the same steps."""
    lines, single = [], {}
    for r in methods:
        phases = r.get("phases") or []
        if len(phases) == 1:
            single.setdefault(_steps(phases[0]["steps_judged"]), []).append(r["method"])
        elif phases:
            lines.append(f"{r['method']}: " + "; ".join(f"{p['phase']} {_steps(p['steps_judged'])}" for p in phases))
    lines[:0] = [f"{', '.join(names)}: one phase, {steps}" for steps, names in single.items()]
    return escape("\n".join(["steps judged in each phase:", *lines])) if lines else ""


def _steps(steps: list[int]) -> str:
    """Judged steps as ranges: [2, 3, 4, 7] -> 'steps 2-4, 7'; none: 'no step'."""
    if not steps:
        return "no step"
    runs, start = [], steps[0]
    for prev, cur in zip(steps, [*steps[1:], None]):
        if cur != prev + 1:
            runs.append(f"{start}-{prev}" if prev > start else f"{start}")
            start = cur
    return ("step " if len(steps) == 1 else "steps ") + ", ".join(runs)


def bench_report(title: str, measure, table, as_json: bool, width: int | None = None) -> dict:
    """Run a benchmark under a progress line (``measure(phase)`` reports its phases), then print
    its report as JSON or as ``table(report)``; the report."""
    with Progress(TextColumn("{task.description}"), console=console, transient=True) as bar:
        task = bar.add_task(title)
        report = measure(lambda text: bar.update(task, description=text))
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        Console(width=max(Console().width, width or 0)).print(table(report))
    return report


def soak_table(report: dict) -> Table:
    table = Table(title=f"soak: {report['runs']} runs in {report['minutes']:g} min ({', '.join(report['launchers'])}); "
                        f"left behind: {len(report['leaks'])}; open files {report['fds_before']} -> {report['fds_after']}")
    for col in ("scenario", "runs", "as expected", "steps recorded"):
        table.add_column(col, justify="left" if col == "scenario" else "right")
    for r in report["scenarios"]:
        table.add_row(r["scenario"], str(r["runs"]), str(r["as_expected"]), str(r["steps"]))
    for r in report["unexpected"]:
        table.add_row(escape(f"UNEXPECTED {r['scenario']} run {r['run_id']}: exit {r['exit_code']}, {r['status']}, "
                             f"{r['note']} {r['error'] or ''}"[:400]), "", "", "")
    for leak in report["leaks"]:
        table.add_row(escape(f"LEFT BEHIND {leak}"[:400]), "", "", "")
    return table


def scale_table(report: dict) -> Table:
    m = report["machine"]
    cap = f"{report['cpus_per_node']:g} CPUs per node" if report["cpus_per_node"] else "no CPU cap"
    start = "workers forked by one fork server" if report.get("fork_server") else "an interpreter per node"
    table = Table(title=f"bench scale on {m['cpus']} x {m['cpu']}: {report['workload']}, {report['bw']}, "
                        f"{report['steps']} steps, {cap}, {start}",
                  caption="fixed cost: the run's wall time beyond its steps (network up and down, workers, torch "
                          "and the process group started on every node, evaluation; the fork server's start in the "
                          "first row); memory: per node, median, at the node's end (USS: the pages only it maps, "
                          "which its exit frees; PSS: those plus its share of the pages it shares)")
    for col in ("nodes", "run", "wall", "fixed cost", "network up / down", "USS per node", "PSS per node",
                "peak RSS per node", "median step", "bus bandwidth", "of link"):
        table.add_column(col, justify="right")
    for r in report["rows"]:
        if r["status"] != "ok":
            table.add_row(str(r["nodes"]), r["run_id"], fmt(r["wall_s"], " s"), escape(f"FAILED: {r['error'] or ''}"[:200]),
                          "", "", "", "", "", "", "")
            continue
        table.add_row(str(r["nodes"]), r["run_id"], fmt(r["wall_s"], " s"), fmt(r["fixed_s"], " s"),
                      f"{fmt(r['build_s'], ' s')} / {fmt(r['teardown_s'], ' s')}", fmt(r["uss_bytes"], " MB", 1e6),
                      fmt(r["pss_bytes"], " MB", 1e6),
                      fmt(r["rss_bytes"], " MB", 1e6), fmt(r["median_step_s"], " s"), fmt(r["busbw_bps"], " Mbit/s", 1e6),
                      fmt(r["busbw_fraction"] * 100 if r["busbw_fraction"] else None, " %"))
    return table


def bench_kernels_table(report: dict) -> Table:
    table = Table(title=f"kernels on {report['machine']} ({report['device']}, {report['threads']} threads), "
                        f"{report['size']:,} elements; copy {report['copy_gbps']:.1f} GB/s (median of the rows' own)")
    for col in ("kernel", "native ms", "torch ms", "speedup", "GB/s", "copy GB/s", "% copy", "vs torch.topk"):
        table.add_column(col, justify="left" if col == "kernel" else "right")
    for r in report["rows"]:
        table.add_row(r["kernel"], f"{r['native_ms']:.2f}", f"{r['reference_ms']:.1f}", f"{r['speedup']:.1f}x",
                      f"{r['gbps']:.1f}", f"{r['copy_gbps']:.1f}", f"{r['pct_copy']:.0f}",
                      f"{r['vs_topk']:.1f}x" if "vs_topk" in r else "")
    return table


def bench_net_table(report: dict) -> Table:
    floor, line0, ceiling = report["probe_floor"], report["delayline_0ms"], report["ceiling"]
    table = Table(title=f"bench net on {report['machine']['cpus']} x {report['machine']['cpu']}, "
                        f"kernel {report['machine']['kernel']}",
                  caption=f"probe RTT floor (unshaped veth) {floor['rtt_idle_s'] * 1e3:.3f} ms; delay line adds "
                          f"{line0['added_rtt_s'] * 1e3:.3f} ms at 0 ms; host ceiling {ceiling['veth_wire_bps'] / 1e9:.2f} "
                          f"Gbit/s on veth, {ceiling['delayline_wire_bps'] / 1e9:.2f} Gbit/s through the delay line")
    for col in ("rate", "latency", "delay by", "wire rate", "error", "goodput", "RTT target", "RTT idle",
                "excess", "excess - floor", "RTT loaded", "rate", "RTT"):
        table.add_column(col, justify="right")
    for c in report["cells"]:
        table.add_row(format_rate(c["rate_bps"]), format_duration(c["latency_s"]), c["impl"],
                      fmt(c["wire_bps"], " Mbit/s", 1e6, 4), fmt(c["rate_error"] * 100 if c["rate_error"] is not None else None, "%", 1, 2),
                      fmt(c["goodput_bps"], " Mbit/s", 1e6, 4), f"{c['rtt_target_s'] * 1e3:g} ms",
                      fmt(c["rtt_idle_s"], " ms", 1e-3, 4), fmt(c["rtt_excess_s"], " ms", 1e-3, 2),
                      fmt(c["rtt_excess_over_floor_s"], " ms", 1e-3, 2),
                      fmt(c["rtt_loaded_s"], " ms", 1e-3, 4), "ok" if c["rate_ok"] else "MISS",
                      "ok" if c["rtt_ok"] else ("ok-floor" if c["rtt_ok_over_floor"] else "MISS"))
    return table


def fmt(value, unit: str = "", scale: float = 1.0, digits: int = 3) -> str:
    """``digits`` significant digits, never in exponent form (1000, not 1e+03)."""
    if value is None:
        return "-"
    v = value / scale
    text = f"{v:.0f}" if abs(v) >= 10 ** digits else f"{v:.{digits}g}"
    if "e" in text:
        text = f"{v:.{digits}f}".rstrip("0").rstrip(".")
    return f"{text}{unit}"


def print_summary(s: results.RunSummary) -> None:
    from .. import compress
    table = Table(title=f"run {s.run_id}  [{s.status}]", show_header=False)
    rows = [
        ("compressor", f"{s.compressor} ({s.kernels} kernels)" if compress.get(s.compressor).has_kernels
         else s.compressor), ("workload", f"replay of {s.replayed}" if s.replayed else s.workload),
        ("nodes", str(s.nodes)),
        ("link", f"topology {s.topology} (see its calibration)" if s.topology
         else f"{format_rate(s.bw_bps)}, latency {format_duration(s.latency_s)}"),
        ("steps recorded", f"{s.steps_recorded} / {s.steps}"),
        *([("time dilation", f"dilated x{s.dilate:g}: links shaped at rate / {s.dilate:g} with delays x {s.dilate:g}; "
                             "times and rates below in emulated units (the store keeps host seconds)")]
          if s.dilate != 1 else []),
        ("median step", fmt(s.median_step_s, " s")),
        ("  compute (fwd+bwd, incl. waiting on comm)", fmt(s.median_compute_s, " s")),
        ("  communication span", fmt(s.median_comm_s, " s")),
        ("samples/s", fmt(s.samples_per_s)),
        (f"payload per step (accounting, {s.per_step_stat})", fmt(s.payload_bytes_per_step, " MB", 1e6)),
        (f"sent per node per step (eth0, {s.per_step_stat})", fmt(s.wire_bytes_per_step, " MB", 1e6)),
        (f"buckets exchanged per step ({s.per_step_stat})", fmt(s.buckets_per_step, digits=3)),
        ("all-reduce bus bandwidth", fmt(s.busbw_bps, " Mbit/s", 1e6)
         + (f"  ({s.busbw_fraction_of_link:.1%} of link)" if s.busbw_fraction_of_link else "")),
        *([("replay behind its trace", fmt(s.median_behind_s, " s") + (
            "  (HOST-BOUND: this host, not the link, set these step times)" if s.host_behind else ""))]
          if s.median_behind_s is not None else []),
        ("final loss", fmt(s.final_loss, digits=5)),
        ("replicas bit-identical", {True: "yes", False: "NO", None: "-"}[s.params_identical]),
    ]
    if s.comm != "allreduce":
        options = ",".join(f"{k}={v}" for k, v in s.comm_options.items())
        rows.insert(3, ("comm", f"{s.comm}:{options}"))
    if s.servers:
        rows.append(("  push / pull (workers)", f"{fmt(s.median_push_s, ' s')} / {fmt(s.median_pull_s, ' s')}"))
        for v in s.servers:
            rows.append((f"  server {v['server']}: wait / sum / send", f"{fmt(v['median_wait_s'], ' s')} / "
                         f"{fmt(v['median_sum_s'], ' s')} / {fmt(v['median_send_s'], ' s')}; in "
                         f"{fmt(v['median_push_bytes'], ' MB', 1e6)}, out {fmt(v['median_pull_bytes'], ' MB', 1e6)} per step"))
        rows.append(("bottleneck", s.bottleneck or "-"))
    if s.median_sync_s is not None:
        rows.append(("  model averaging (when it ran)", fmt(s.median_sync_s, " s")))
    if s.amortised:
        a = s.amortised
        rows.append(("mean step (what the report compares)", f"{fmt(a['step_s'], ' s')}, {a['averaged_share']:.0%} of "
                     f"{a['steps']} steps averaged, {fmt(a['expected_tx_bytes'], ' MB', 1e6)} sent per step"))
    if s.sent_fraction is not None:
        rows.append(("elements sent", f"{s.sent_fraction:.3%} of the gradient (median step)"))
    if s.contract:
        c = s.contract
        verdict = "kept" if c["ok"] else "BROKEN: " + "; ".join(contracts.describe(c["problems"], limit=2))
        rows.append(("contract (gctestbed verify)", f"{fmt(c['contract_wire_bytes'], ' MB', 1e6)} per node per step "
                     f"against {fmt(c['counters_bytes'], ' MB', 1e6)} counted (steps {c['steps_judged'][0]}-"
                     f"{c['steps_judged'][-1]}): {verdict}" if c["steps_judged"] else f"no step judged: {verdict}"))
    if s.latency_impl not in (None, "none"):
        rows.append(("delay made by", s.latency_impl))
    if s.host_bound:
        rows.append(("HOST-BOUND", s.host_bound_reason))
    if s.environment.get("columns_not_stored"):
        rows.append(("not stored", "a newer host's " + ", ".join(s.environment["columns_not_stored"])
                     + ": this store's schema has no column for them (update gctestbed here)"))
    rows += _cpu_rows(s.cpu, warned=bool(s.host_bound))
    if s.phases:
        p = s.phases
        rows.append(("wall time" + (" on this host (not dilated)" if s.dilate != 1 else ""), f"{p['total_s']:.1f} s: steps {p['steps_s']:.1f} s, calibration "
                                  f"{p.get('calibrate_s', 0.0):.1f} s, fixed cost {p['fixed_s']:.1f} s (network "
                                  f"{p['build_s']:.1f} s + {p['teardown_s']:.1f} s down, nodes start and stop)"))
    for c in s.calibration:
        rows.append((f"calibration {c['src']} -> {c['dst']} ({c['tool']})" + (", as shaped" if s.dilate != 1 else ""),
                     f"{fmt(c['wire_bps'], ' Mbit/s', 1e6)} of {c['target_bps'] / 1e6:g}, RTT {fmt(c['rtt_idle_s'], ' ms', 1e-3)}"
                     f" idle / {fmt(c['rtt_loaded_s'], ' ms', 1e-3)} loaded" + ("  MISSED" if c["miss"] else "")))
    for f in s.faults:
        if f["started"] is None:
            effect = "never started (the run ended first)"
        elif not f["steps"]:
            effect = "no step ran while it was on"
        else:
            span = f"step {f['steps'][0]}" if len(f["steps"]) == 1 else f"steps {f['steps'][0]}-{f['steps'][-1]}"
            effect = (f"{span}: median step {fmt(f['median_step_s_during'], ' s')} "
                      f"(other steps {fmt(f['median_step_s_outside'], ' s')})")
        rows.append((f"fault {f['fault']}", effect))
    if s.counters_error:
        rows.append(("qdisc counters", f"not read at the end: {s.counters_error}"))
    if s.error:
        rows.append(("error", s.error))
    for k, v in rows:
        table.add_row(escape(k), escape(v))         # workers' errors quote C++ paths in [brackets]
    Console().print(table)


def _cpu_rows(cpu: dict | None, warned: bool = False) -> list[tuple[str, str]]:
    """How the nodes shared the CPUs: the cap, or a warning when more nodes than cores ran
    uncapped (only the fact where the HOST-BOUND row has warned already); each node's CPU time
    against wall time, where either is worth reading; the host's own CPU over the steps."""
    host = cpu.get("host") if cpu else None
    rows = [("host CPU over the steps", f"{host['busy']:.0%} busy (user {host['user']:.0%}, kernel {host['system']:.0%}, "
                                        f"interrupts {host['irq']:.0%}, steal {host['steal']:.0%}); saturated "
                                        f"{host['saturated_share']:.0%} of {host['window_s']:.1f} s on this host")] if host else []
    if not cpu or not (cpu["cpus_per_node"] or cpu["contended"]):
        return rows
    if cpu["cpus_per_node"]:
        head = ("CPU per node", f"held to {cpu['cpus_per_node']:g} CPUs (cgroup)")
    else:
        head = ("CPU contention", f"{len(cpu['nodes'])} nodes shared {cpu['host_cpus']} cores with no --cpus-per-node"
                                  + ("" if warned else ": compute times depend on the scheduler"))
    kernel = cpu.get("cgroups") or {}
    rows.append(head)
    for n in cpu["nodes"]:
        if n["cpu_share"] is None:
            continue
        k = kernel.get(str(n["rank"]))
        throttled = f", throttled {k['throttled_s']:.1f} s in {k['throttled_periods']} of {k['periods']} periods" if k else ""
        rows.append((f"  node {n['rank']} CPU / wall", f"{n['cpu_s']:.1f} s / {n['wall_s']:.1f} s "
                                                       f"({n['cpu_share']:.2f} CPUs){throttled}"))
    return rows


def print_report(r: dict) -> None:
    """The break-even table, the fastest method per setting, the model's fit and the projection."""
    from ..analysis import report as report_
    terminal = Console(width=max(Console().width, 120))
    table = Table(title=f"break-even bandwidth (below it the method's steps are faster than {r['baseline']}'s)")
    for col in ("setting", "method", "break-even", "convergence"):
        table.add_column(col)
    for b in r["break_even"]:
        table.add_row(b["group"], b["compressor"], b["text"], "; ".join(b["flags"]) or "-")
    terminal.print(table)
    if r.get("dilated"):
        terminal.print(report_.dilated_label(r["dilated"]))
    if r.get("host_bound"):
        terminal.print(report_.host_bound_label(r["host_bound"]))
    if r.get("dilation_test"):
        terminal.print(report_.dilation_label(r["dilation_test"]))
    for t in r["time_to_accuracy"]:
        target = (f"accuracy {t['target_accuracy']:.3f}" if t["target_accuracy"] is not None else f"loss {t['target_loss']:.4g}")
        terminal.print(f"time to {target}, {t['group']}: " + ", ".join(
            f"{e['compressor']} @ {report_.fmt_bw(e['bw_bps'])} "
            + ("never" if e["seconds"] is None else f"{e['steps']} steps {e['seconds']:.2f} s") for e in t["rows"]))
        if t["break_even"]:
            terminal.print(f"break-even by time to {target}: " + "; ".join(f"{b['compressor']} {b['text']}" for b in t["break_even"]))
    for group, best in r["best"].items():
        terminal.print(f"fastest, {group}: " + ", ".join(f"{report_.fmt_bw(b['bw_bps'])} {b['compressor']}" for b in best))
    if not r["model"]:
        terminal.print(report_.NO_MODEL)
    for variant, m in r["model"].items():
        terminal.print(f"model ({variant}): {report_.lambda_label(m)}, alpha {m['alpha_s'] * 1e6:.0f} us, eta {m['eta']:.3f}; "
                       f"median |error| {report_.pct(m['median_abs_error'])} over {m['predicted_cells']} predicted cells, "
                       f"{len(m['misses'])} off by more than 10 % (each with its reason in report.html)")
    held = r.get("held_out")
    if held:
        terminal.print(f"model fitted on {report_.held_out_label(held)}, tested on other node counts: " + ", ".join(
            f"{p} nodes {report_.pct(v['median_abs_error'])} median |error| over {v['cells']} cells"
            + (f" ({v['host_bound_cells']} HOST-BOUND; without them {report_.pct(v['median_abs_error_host_free'])})"
               if v["host_bound_cells"] else "")
            for p, v in held["by_nodes"].items()))
        for method, by in held["measured_speedup"].items():
            terminal.print(f"  measured speedup over none, {method}: " + ", ".join(f"{p} nodes {x:.2f}x" for p, x in sorted(by.items())))
    if r["projection"] and r["projection"]["rows"]:
        proj = r["projection"]
        table = Table(title=f"projected break-even bandwidth: {proj['label']}")
        for col in ["setting", "method"] + [f"{p} nodes" for p in proj["nodes"]]:
            table.add_column(col)
        for row in proj["rows"]:
            table.add_row(f"{row['workload']}, batch {row['batch_size']}", row["compressor"],
                          *[report_.fmt_bw(v) if isinstance(v, float) else v for v in row["break_even_bps"].values()])
        terminal.print(table)


def calibration_table(cluster_id: str, paths: list) -> Table:
    table = Table(title=f"calibration of gct-{cluster_id}")
    for col in ("path", "tool", "target", "wire rate", "goodput", "target RTT", "RTT idle", "RTT loaded", ""):
        table.add_column(col)
    for p in paths:
        table.add_row(f"{p.src} -> {p.dst}", p.tool, format_rate(p.target_bps), fmt(p.wire_bps, " Mbit/s", 1e6),
                      fmt(p.goodput_bps, " Mbit/s", 1e6), fmt(p.target_rtt_s, " ms", 1e-3),
                      fmt(p.rtt_idle_s, " ms", 1e-3), fmt(p.rtt_loaded_s, " ms", 1e-3), p.miss and "MISS" or "ok")
    return table


def compressors_table(rows: list[dict]) -> Table:
    table = Table(title="compressors (--compressor NAME:key=value,...)", show_lines=True)
    for col in ("name", "collective", "options (default)", "what", "paper"):
        table.add_column(col)
    for r in rows:
        opts = ", ".join(f"{o['name']}={o['default']}" for o in r["options"]) or "-"
        table.add_row(r["name"], r["collective"], opts, r["summary"], r["paper"] or "-")
    return table


def doctor_table(checks: list) -> Table:
    table = Table(title="gctestbed doctor")
    for col in ("", "check", "found", "without it", "to get it"):
        table.add_column(col)
    for c in checks:
        table.add_row("[green]ok[/]" if c.ok else "[red]--[/]", c.name, c.detail, "" if c.ok else c.disables,
                      "" if c.ok else c.fix)
    return table


def convergence_table(report: dict, nodes: int, steps: int) -> Table:
    (wl, wl_opts), = report["workload"].items()
    (opt, _), = report["optimizer"].items()
    base = report["baseline"]
    table = Table(title=f"bench convergence: {nodes} nodes, {steps} steps, {wl} {wl_opts}, {opt}",
                  caption=f"steps to target: first step whose 10-step mean loss <= {fmt(report['target_loss'], digits=4)}"
                          f" ({base}'s final x 1.05)")
    for col in ("method", "options", "final loss", "held-out loss", "accuracy", f"vs {base}", "steps to target",
                f"bytes vs {base}"):
        table.add_column(col, justify="right")
    for name, r in report["methods"].items():
        table.add_row(name, r["compressor"].partition(":")[2] or "-",
                      "diverged" if r["diverged"] else fmt(r["final_loss"], digits=4),
                      fmt(r["eval_loss"], digits=4), fmt(r["eval_accuracy"] * 100 if r["eval_accuracy"] is not None else None, "%", digits=4),
                      fmt(r.get("accuracy_vs_baseline", 0) * 100 if r.get("accuracy_vs_baseline") is not None else None, " pt", digits=2),
                      str(r.get("steps_to_target") or "never"), fmt(r.get("bytes_vs_baseline"), "x", digits=3))
    return table



def listing_table(rows: list[dict]) -> Table:
    table = Table()
    for col in ("name", "kind", "alive", "nodes", "subnet", "delay"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["name"], r["kind"], "yes" if r["alive"] else "no (gctestbed clean)", str(r["nodes"]),
                      r["subnet"], r["latency_impl"] or "-")
    return table


def cluster_table(state) -> Table:
    """The nodes of a cluster 'up' built (its ledger)."""
    table = Table(title=f"gct-{state.run_id}  (delay: {state.meta['latency_impl']}, subnet {state.subnet})")
    for col in ("node", "namespace", "address"):
        table.add_column(col)
    for n in state.meta["nodes"]:
        table.add_row(str(n["rank"]), n["netns"], n["address"])
    return table


def trace_table(about: dict) -> Table:
    """``gctestbed trace show``: one row per rank, medians over its steps after the first."""
    job, rec = about["job"], about["recorded"]
    if rec.get("source") == "torch.profiler":        # a user's own job, profiled (profiler_import): no run, no model
        title = (f"trace v{about['version']} imported from torch.profiler ({', '.join(rec['files'])}): DDP's all-reduce, "
                 f"{about['parameters']} buckets of {about['elements']:,} elements, {job['nodes']} ranks; profiled on "
                 f"{rec['host']} ({rec['device']}, {rec['backend']})")
    else:
        title = (f"trace v{about['version']} of run {rec['run_id']}: {job['compressor']} on {job['workload']} "
                 f"({about['parameters']} parameters, {about['elements']:,} elements), {job['nodes']} nodes, "
                 f"{job['mode']}; recorded on {rec['host']} ({rec['cpus']} CPUs, {rec['device']}, torch {rec['torch']})")
    table = Table(title=title)
    for col in ("rank", "steps", "step", "compute", "optimizer", "encode", "decode", "buckets", "bytes sent"):
        table.add_column(col, justify="right")
    for r in about["ranks"]:
        table.add_row(str(r["rank"]), str(r["steps"]), *(_seconds(r[k]) for k in ("step_s", "compute_s", "optim_s", "encode_s", "decode_s")),
                      f"{r['buckets']:g}" if r["buckets"] is not None else "-", verify_.fmt_bytes(r["bytes"]) if r["bytes"] is not None else "-")
    return table


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{1000 * value:.3g} ms"

