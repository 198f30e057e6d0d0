"""A device allow-list on cgroup v2: a ``BPF_PROG_TYPE_CGROUP_DEVICE`` program, assembled here
and loaded and attached with the ``bpf(2)`` system call (through ctypes: no external tool,
compiler or systemd). The kernel runs it on every open or mknod of a device node by a process
of the cgroup; it allows the access when it returns 1. This is what runc and systemd's
``DeviceAllow=`` do on the unified hierarchy, which has no devices controller files."""

from __future__ import annotations

import ctypes
import functools
import os
import platform
import struct
from collections.abc import Sequence
from pathlib import Path

from scheduling.agent.isolation.devices import DeviceRule

_SYSCALL_BPF = {"x86_64": 321, "aarch64": 280, "ppc64le": 361, "s390x": 351}
_BPF_PROG_LOAD = 5
_BPF_PROG_ATTACH = 8
_BPF_PROG_TYPE_CGROUP_DEVICE = 15
_BPF_CGROUP_DEVICE = 6  # the attach type
_BPF_F_ALLOW_MULTI = 2  # programs of the parents (systemd's) keep applying: all must allow
_ATTR_SIZE = 128
_LOG_SIZE = 64 * 1024

# struct bpf_cgroup_dev_ctx: access_type (device type | access << 16), major, minor (u32 each).
_TYPE_BITS = {"b": 1, "c": 2}
_ACCESS_BITS = {"m": 1, "r": 2, "w": 4}

# Instruction opcodes used (class | operation | source).
_LDX_W = 0x61  # dst = *(u32 *)(src + off)
_AND32_K = 0x54
_RSH32_K = 0x74
_MOV32_X = 0xBC
_MOV64_K = 0xB7
_JNE_K = 0x55  # if dst != imm: pc += off
_EXIT = 0x95


class BpfError(OSError):
    pass


def _insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return struct.pack("<BBhi", code, (src << 4) | dst, off, imm)


def device_program(rules: Sequence[DeviceRule]) -> bytes:
    """The program's instructions: allow an access that one of ``rules`` allows, refuse the
    rest. Registers: r2 the device type, r3 the access asked, r4 the major, r5 the minor."""
    program = [
        _insn(_LDX_W, dst=2, src=1, off=0),
        _insn(_AND32_K, dst=2, imm=0xFFFF),
        _insn(_LDX_W, dst=3, src=1, off=0),
        _insn(_RSH32_K, dst=3, imm=16),
        _insn(_LDX_W, dst=4, src=1, off=4),
        _insn(_LDX_W, dst=5, src=1, off=8),
    ]
    for rule in rules:
        # A rule's block: checks that jump past the block when the access does not match it,
        # then "return 1". A jump's offset counts the instructions it skips.
        block: list[bytes | tuple[int, int]] = [(2, _TYPE_BITS[rule.type])]
        allowed = sum(_ACCESS_BITS[letter] for letter in set(rule.access))
        if allowed != 7:  # the access asked must lie within the rule's: r3 & ~allowed == 0
            block += [_insn(_MOV32_X, dst=1, src=3), _insn(_AND32_K, dst=1, imm=~allowed & 7)]
            block.append((1, 0))
        if rule.major is not None:
            block.append((4, rule.major))
        if rule.minor is not None:
            block.append((5, rule.minor))
        block += [_insn(_MOV64_K, dst=0, imm=1), _insn(_EXIT)]
        for position, item in enumerate(block):
            if isinstance(item, bytes):
                program.append(item)
            else:
                register, value = item
                skip = len(block) - position - 1
                program.append(_insn(_JNE_K, dst=register, off=skip, imm=value))
    program += [_insn(_MOV64_K, dst=0, imm=0), _insn(_EXIT)]
    return b"".join(program)


def attach_device_program(cgroup_dir: Path, rules: Sequence[DeviceRule]) -> None:
    """Load the program of ``rules`` and attach it to a cgroup2 directory, before any process
    joins it. ``BpfError`` when the kernel refuses (no CAP_BPF/CAP_SYS_ADMIN, no cgroup2)."""
    code = device_program(rules)
    program_fd = _load(code)
    try:
        cgroup_fd = os.open(cgroup_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            attr = struct.pack(
                "<IIII", cgroup_fd, program_fd, _BPF_CGROUP_DEVICE, _BPF_F_ALLOW_MULTI
            )
            _bpf(_BPF_PROG_ATTACH, attr, "cannot attach the device program to " + str(cgroup_dir))
        finally:
            os.close(cgroup_fd)
    finally:
        os.close(program_fd)  # the attachment keeps the program while the cgroup lives


def _load(code: bytes) -> int:
    instructions = ctypes.create_string_buffer(code, len(code))
    license_text = ctypes.create_string_buffer(b"Apache-2.0")

    def attr(log: ctypes.Array[ctypes.c_char] | None) -> bytes:
        head = struct.pack(
            "<IIQQIIQII",
            _BPF_PROG_TYPE_CGROUP_DEVICE,
            len(code) // 8,
            ctypes.addressof(instructions),
            ctypes.addressof(license_text),
            1 if log is not None else 0,
            _LOG_SIZE if log is not None else 0,
            ctypes.addressof(log) if log is not None else 0,
            0,
            0,
        )
        return head + b"gpuadmin_dev".ljust(16, b"\0")

    try:
        return _bpf(_BPF_PROG_LOAD, attr(None), "cannot load the device program")
    except BpfError as exc:
        log = ctypes.create_string_buffer(_LOG_SIZE)
        try:  # again, for the verifier's words
            return _bpf(_BPF_PROG_LOAD, attr(log), "cannot load the device program")
        except BpfError:
            verifier = log.value.decode(errors="replace").strip().splitlines()[-3:]
            raise BpfError(exc.errno, f"{exc.strerror} ({' / '.join(verifier)})") from None


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _bpf(command: int, attr: bytes, what: str) -> int:
    number = _SYSCALL_BPF.get(platform.machine())
    if number is None:
        raise BpfError(0, f"{what}: bpf(2) is not known on {platform.machine()}")
    buffer = ctypes.create_string_buffer(attr.ljust(_ATTR_SIZE, b"\0"), _ATTR_SIZE)
    result = _libc().syscall(number, command, buffer, _ATTR_SIZE)
    if result < 0:
        errno = ctypes.get_errno()
        raise BpfError(errno, f"{what}: {os.strerror(errno)}")
    return int(result)
