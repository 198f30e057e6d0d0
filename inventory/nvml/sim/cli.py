"""``gpuadmin sim ...``: machine models, a running simulated node's GPUs, captured machines.

``import`` turns a captured machine into a machine model (``inventory.nvml.sim.importer``).

``main(argv)`` parses ``argv`` (without the program name) and returns an exit status. Commands that
touch a node need its state directory: ``--state-dir DIR`` or ``$GPUADMIN_SIM_STATE_DIR``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

import pynvml

from . import faults
from .model import list_models, load_model
from .state import SimStateError

STATE_DIR_ENV = "GPUADMIN_SIM_STATE_DIR"


def _error_code(text: str) -> int:
    """``GPU_IS_LOST``, ``NVML_ERROR_GPU_IS_LOST`` or ``15`` -> 15."""
    if text.isdecimal():
        return int(text)
    name = text.upper()
    if not name.startswith("NVML_ERROR_"):
        name = f"NVML_ERROR_{name}"
    code = getattr(pynvml, name, None)
    if not isinstance(code, int):
        raise argparse.ArgumentTypeError(f"unknown NVML error {text!r}")
    return code


_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600}


def _duration(text: str) -> float:
    """``90``, ``60s``, ``1.5m`` or ``1h`` -> seconds (above 0)."""
    number, unit = text.rstrip("smh"), text[len(text.rstrip("smh")) :]
    try:
        seconds = float(number) * _UNITS[unit]
    except (KeyError, ValueError):
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 60s, 5m)") from None
    if not 0 < seconds < float("inf"):
        raise argparse.ArgumentTypeError(f"a duration above 0 s, not {text!r}")
    return seconds


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--state-dir",
        default=os.environ.get(STATE_DIR_ENV),
        help=f"directory of the per-node state files (default ${STATE_DIR_ENV})",
    )
    node_gpu = argparse.ArgumentParser(add_help=False, parents=[common])
    node_gpu.add_argument("node")
    node_gpu.add_argument("gpu", type=int)

    parser = argparse.ArgumentParser(prog="gpuadmin sim", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("models", help="list the machine models")

    inject = sub.add_parser("inject", help="inject a fault").add_subparsers(
        dest="fault", required=True
    )
    p = inject.add_parser("xid", parents=[node_gpu], help="deliver an XID event")
    p.add_argument("xid", type=int)
    p.add_argument("--message", default="")
    p.add_argument("--gi", type=int, help="GPU instance the XID is attributed to")
    p.add_argument("--ci", type=int, help="compute instance the XID is attributed to")
    p = inject.add_parser("ecc", parents=[node_gpu], help="set an ECC error counter")
    p.add_argument("count", type=int)
    p.add_argument("--error", choices=("corrected", "uncorrected"), default="uncorrected")
    p.add_argument("--counter", choices=("volatile", "aggregate", "both"), default="both")
    p.add_argument("--location", choices=("dram", "sram"), default="dram")
    p = inject.add_parser("remap", parents=[node_gpu], help="set row-remapper counters")
    p.add_argument("--correctable", type=int)
    p.add_argument("--uncorrectable", type=int)
    p.add_argument("--pending", action=argparse.BooleanOptionalAction)
    p.add_argument("--failure", action=argparse.BooleanOptionalAction)
    p = inject.add_parser(
        "temp", parents=[node_gpu], help="pin the GPU temperature, or ramp it (--over)"
    )
    p.add_argument("celsius", type=int, help="the temperature (the ramp's target), °C")
    p.add_argument(
        "--over",
        type=_duration,
        metavar="DURATION",
        help="ramp from the current temperature to CELSIUS over this long (90, 60s, 5m, 1h), "
        "then hold it",
    )
    p = inject.add_parser("nvlink", parents=[node_gpu], help="add NVLink errors on a link")
    p.add_argument("count", type=int)
    p.add_argument("--counter", choices=faults.NVLINK_COUNTERS, default="crc_flit")
    p.add_argument("--link", type=int, default=0)
    p = inject.add_parser("brake", parents=[node_gpu], help="assert the HW power brake")
    p.add_argument("--off", action="store_true", help="release it")
    inject.add_parser("lost", parents=[node_gpu], help="the GPU falls off the bus (XID 79)")
    p = inject.add_parser("fail", parents=[node_gpu], help="make every query on the GPU fail")
    p.add_argument("--code", type=_error_code, default=pynvml.NVML_ERROR_UNKNOWN)
    p = inject.add_parser("clear", parents=[common], help="remove injected faults")
    p.add_argument("node")
    p.add_argument("gpu", type=int, nargs="?")

    proc = sub.add_parser("proc", help="run or stop a simulated process").add_subparsers(
        dest="action", required=True
    )
    p = proc.add_parser("start", parents=[node_gpu])
    p.add_argument("pid", type=int)
    p.add_argument("--mem", type=int, required=True, help="GPU memory used, MiB")
    p.add_argument("--util", type=int, default=100, help="utilization of its GPU/MIG device, %%")
    p.add_argument("--gi", type=int, help="GPU instance (MIG-enabled GPUs)")
    p.add_argument("--ci", type=int, help="compute instance (default 0)")
    p.add_argument("--name", default="python")
    p = proc.add_parser("stop", parents=[common])
    p.add_argument("node")
    p.add_argument("pid", type=int)

    sub.add_parser("reset", parents=[node_gpu], help="reset a GPU (applies pending MIG mode)")
    p = sub.add_parser("reboot", parents=[common], help="reboot a node")
    p.add_argument("node")
    # Listed here; main() hands its arguments to the importer, which parses them itself.
    sub.add_parser(
        "import",
        help="turn a captured machine (nvidia-smi -q -x or -q, topo -m) into a machine model "
        "(gpuadmin sim import --help)",
    )
    return parser


def _run(args: argparse.Namespace) -> str:
    if args.command == "models":
        return "\n".join(f"{name}\t{load_model(name).description}" for name in list_models())
    if not args.state_dir:
        raise ValueError(f"--state-dir (or ${STATE_DIR_ENV}) is required")
    target, node = args.state_dir, args.node
    if args.command == "reset":
        faults.reset_gpu(target, node, args.gpu)
        return f"{node}: GPU {args.gpu} reset"
    if args.command == "reboot":
        faults.reboot(target, node)
        return f"{node}: rebooted"
    if args.command == "proc":
        if args.action == "start":
            faults.start_process(
                target,
                node,
                args.gpu,
                args.pid,
                used_mib=args.mem,
                util=args.util,
                gpu_instance=args.gi,
                compute_instance=args.ci,
                name=args.name,
            )
            return f"{node}: pid {args.pid} started on GPU {args.gpu}"
        faults.stop_process(target, node, args.pid)
        return f"{node}: pid {args.pid} stopped"
    fault = args.fault
    if fault == "xid":
        faults.inject_xid(
            target,
            node,
            args.gpu,
            args.xid,
            message=args.message,
            gpu_instance=args.gi,
            compute_instance=args.ci,
        )
    elif fault == "ecc":
        faults.set_ecc(
            target,
            node,
            args.gpu,
            count=args.count,
            error=args.error,
            counter=args.counter,
            location=args.location,
        )
    elif fault == "remap":
        faults.remap_rows(
            target,
            node,
            args.gpu,
            correctable=args.correctable,
            uncorrectable=args.uncorrectable,
            pending=args.pending,
            failure=args.failure,
        )
    elif fault == "temp":
        faults.set_temperature(target, node, args.gpu, args.celsius, over_s=args.over)
        if args.over:
            return f"{node}: GPU {args.gpu} ramping to {args.celsius} °C over {args.over:g} s"
    elif fault == "nvlink":
        faults.add_nvlink_errors(
            target, node, args.gpu, count=args.count, counter=args.counter, link=args.link
        )
    elif fault == "brake":
        faults.power_brake(target, node, args.gpu, engaged=not args.off)
    elif fault == "lost":
        faults.fall_off_bus(target, node, args.gpu)
    elif fault == "fail":
        faults.fail_queries(target, node, args.gpu, args.code)
    else:
        faults.clear(target, node, args.gpu)
        return f"{node}: faults cleared"
    return f"{node}: injected {fault} on GPU {args.gpu}"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point for ``gpuadmin sim``; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["import"]:
        from inventory.nvml.sim.importer import main as import_main

        return import_main(argv[1:])
    args = _parser().parse_args(argv)
    try:
        message = _run(args)
    except (ValueError, SimStateError) as exc:
        sys.stderr.write(f"gpuadmin sim: {exc}\n")
        return 2
    sys.stdout.write(message + "\n")
    return 0
