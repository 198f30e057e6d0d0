"""The first instruction of every job: join its cgroups, bind its CPUs, become its account,
then exec the job (so there is no moment at which it runs unconfined).

Run by the executor as ``python -I -S launch.py CONFIG COMMAND...`` (standard library only,
nothing from the job's environment or working directory is imported); CONFIG is JSON:
``procs`` (``cgroup.procs`` files to join), ``cpus``, ``uid``/``gid``/``groups`` (omitted:
stay the agent's account), ``program`` (the file COMMAND's first word names: found by the
executor, since nothing can be imported once the account changed) and ``error_fd``, closed
by a successful exec; a failure is written there instead and the launcher exits 127."""

import json
import os
import sys


def main() -> None:
    config = json.loads(sys.argv[1])
    command = sys.argv[2:]
    error_fd = config["error_fd"]
    step = "cannot join its cgroup"
    try:
        for procs in config["procs"]:
            with open(procs, "w") as file:
                file.write(str(os.getpid()))
        step = "cannot bind its CPUs"
        if config.get("cpus"):
            os.sched_setaffinity(0, config["cpus"])
        step = "cannot switch to its account"
        if config.get("uid") is not None:
            os.setgroups(config["groups"])
            os.setgid(config["gid"])
            os.setuid(config["uid"])
        step = f"cannot start {command[0]!r}"
        os.set_inheritable(error_fd, False)  # closed by exec: the agent sees the job started
        os.execv(config["program"], command)
    except Exception as exc:
        os.write(error_fd, f"{step}: {exc}".encode())
        os._exit(127)


if __name__ == "__main__":
    main()
