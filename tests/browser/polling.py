"""Live regions' polls (hx-trigger="every 2s") in the browser tests without waiting them out:
the page runs on Playwright's clock, which is moved on to each next poll, and a round is over
once every poll it sent has been answered and swapped in (htmx swaps in the answer's load
handler, before the request's `loadend`). The polls, their requests, answers and swaps are the
real ones; only the seconds between them are skipped."""

from __future__ import annotations

# Counts the polls sent (after poll.js's htmx:confirm let them through) and those answered.
COUNT_POLLS = """
window.__polls = {sent: 0, done: 0};
document.addEventListener("htmx:beforeRequest", (event) => {
  const trigger = event.detail.elt.getAttribute("hx-trigger") || "";
  if (trigger.startsWith("every ")) {
    window.__polls.sent += 1;
    event.detail.xhr.addEventListener("loadend", () => { window.__polls.done += 1; });
  }
});
"""
# The longest poll interval of the page's live regions in ms (0: none polls; a page without
# htmx has no live region, whatever its markup says).
LONGEST_INTERVAL = """
!window.htmx ? 0 : Math.max(0, ...[...document.querySelectorAll('[hx-trigger^="every "]')]
  .map((e) => htmx.parseInterval(e.getAttribute("hx-trigger").split(/\\s+/)[1])))
"""
ANSWERED = "(sent) => window.__polls.sent > sent && window.__polls.done === window.__polls.sent"


def on_clock(target) -> None:  # noqa: ANN001 - a Playwright BrowserContext or Page
    """Before its pages load: their timers run on a clock ``run_polls`` moves on (it runs on
    by itself meanwhile), and their polls are counted."""
    target.clock.install()
    target.add_init_script(COUNT_POLLS)


def poll_interval_ms(page) -> int:  # noqa: ANN001 - a Playwright Page
    """The longest interval between polls of the page's live regions (0: none polls)."""
    return page.evaluate(LONGEST_INTERVAL)


def run_polls(page, rounds: int = 2) -> int:  # noqa: ANN001 - a Playwright Page
    """Each live region of ``page`` (loaded ``on_clock``) polls ``rounds`` times, each round's
    answers swapped in before the next (the second swaps into what the first left); the
    polls sent. A region the first round swapped out for good is not waited for again."""
    for _ in range(rounds):
        interval = poll_interval_ms(page)
        if not interval:
            break
        sent = page.evaluate("window.__polls.sent")
        page.clock.fast_forward(interval)  # each poll due by then fires, once
        page.wait_for_function(ANSWERED, arg=sent, timeout=30_000)
    return page.evaluate("window.__polls.sent")
