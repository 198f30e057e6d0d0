"""Count ``--times`` times in a shared row, each count while holding the placement loop's lease
(``scheduling.loop.passes.pass_lock``) and written in a transaction fenced by it
(``passes.fenced``): read, pause, write. Two holders at once would lose counts.
Run by tests/gpuadmin/test_leases.py, two at a time, through PgBouncer."""

from __future__ import annotations

import argparse
import time

import django


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--row", required=True, help="the lease row whose token is the count")
    parser.add_argument("--times", type=int, required=True)
    args = parser.parse_args()
    django.setup()
    from django.db import connection

    from scheduling.loop import passes

    for _ in range(args.times):
        with passes.pass_lock():
            with connection.cursor() as cursor:
                cursor.execute("SELECT token FROM leases_lease WHERE name = %s", [args.row])
                [(count,)] = cursor.fetchall()
            time.sleep(0.005)  # another holder at once would read the same count meanwhile
            with passes.fenced(), connection.cursor() as cursor:
                cursor.execute(
                    "UPDATE leases_lease SET token = %s WHERE name = %s", [count + 1, args.row]
                )


if __name__ == "__main__":
    main()
