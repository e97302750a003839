"""The dashboard page of `gpulock serve` in Debian's headless Chromium, driven over the
DevTools protocol (tests/support/cdp_client.py, standard library only). The page is loaded
once, before the lease starts; a lease then starts and ends while the same tab stays open, and
the test reads what that tab shows: the page must have updated itself. A marker the test plants
in the page's JavaScript state proves it was never reloaded. A screenshot of the tab goes into
the test's temporary directory.

Chromium runs with --no-sandbox when the tests run as root (its sandbox refuses root)."""

import http.client
import json
import os
import pwd
import shutil
import time

import pytest

from cdp_client import CdpConnection
from gpulock_testing import HANG, wait_until
from test_serve import start_serve

ME = pwd.getpwuid(os.getuid()).pw_name
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture
def browser(gl):
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (scripts/install-deps test_packages)")
    profile = gl.tmp / "chromium-profile"
    argv = [CHROMIUM, "--headless=new", "--disable-gpu", "--no-first-run",
            "--no-default-browser-check", "--no-proxy-server", "--disable-extensions",
            "--user-data-dir=%s" % profile, "--remote-debugging-port=0",
            "--remote-debugging-address=127.0.0.1", "--window-size=1280,900", "about:blank"]
    if os.getuid() == 0:
        argv.insert(1, "--no-sandbox")
    process = gl.spawn_argv(argv)
    port_file = profile / "DevToolsActivePort"
    wait_until(lambda: port_file.exists() and len(port_file.read_text().split()) >= 2,
               timeout=HANG, what="chromium's DevTools port")
    port = int(port_file.read_text().split()[0])

    def page_target():
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=HANG)
        connection.request("GET", "/json/list")
        targets = json.loads(connection.getresponse().read())
        connection.close()
        pages = [t for t in targets if t["type"] == "page"]
        return pages[0] if pages else None
    target = wait_until(page_target, timeout=HANG, what="chromium's page target")
    cdp = CdpConnection(target["webSocketDebuggerUrl"], timeout=HANG)
    cdp.call("Page.enable")
    cdp.call("Runtime.enable")
    try:
        yield cdp
    finally:
        cdp.close()
        process.kill_group()


def page_state(cdp):
    """What the tab shows of GPU 0, read from its DOM."""
    return cdp.evaluate("""(() => {
      const row = document.querySelector('#gpus tr[data-gpu="0"]');
      if (!row) return null;
      return {state: row.dataset.state, holder: row.querySelector('.holder').textContent,
              label: row.querySelector('.label').textContent,
              updates: window.gpulockDashboard ? window.gpulockDashboard.updates : 0,
              marker: window.testMarker || null,
              freshness: document.getElementById('freshness').textContent,
              usage: document.getElementById('usage').textContent};
    })()""")


def test_dashboard_shows_a_lease_start_and_end_without_reloading(gl, browser):
    env = gl.env(fake="2")
    server = start_serve(gl, env=env)
    browser.call("Page.navigate", url="http://127.0.0.1:%d/" % server.port)
    shown = wait_until(lambda: (lambda s: s if s and s["state"] == "free" else None)(
        page_state(browser)), timeout=HANG, what="the dashboard to show GPU 0 free")
    assert shown["freshness"].startswith("updated")
    assert "usage journal not available" not in shown["usage"]
    browser.evaluate("window.testMarker = 'loaded-once'")
    before = shown["updates"]

    holder, lease_id = gl.hold("--gpus", "0", env=env, label="dashboard-test")
    leased = wait_until(lambda: (lambda s: s if s and s["state"] == "leased" else None)(
        page_state(browser)), timeout=HANG, what="the dashboard to show GPU 0 leased")
    assert leased["holder"] == "%s (%s)" % (ME, lease_id)
    assert leased["label"] == "dashboard-test"
    assert leased["marker"] == "loaded-once"  # the same page: it updated itself
    assert leased["updates"] > before
    browser.screenshot(str(gl.tmp / "dashboard-leased.png"))
    assert (gl.tmp / "dashboard-leased.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    holder.kill_group()
    ended = wait_until(lambda: (lambda s: s if s and s["state"] == "free" else None)(
        page_state(browser)), timeout=HANG, what="the dashboard to show GPU 0 free again")
    assert ended["holder"] == "" and ended["label"] == ""
    assert ended["marker"] == "loaded-once"
    browser.screenshot(str(gl.tmp / "dashboard-free.png"))


def test_dashboard_lists_idle_gpus_and_intruders(gl, browser):
    path = gl.write_fake_gpus([{}, {}])
    config = gl.tmp / "config.toml"
    config.write_text('idle_after = "1s"\n')
    env = gl.env(fake=path, GPULOCK_CONFIG=config)
    holder, lease_id = gl.hold("--gpus", "0", env=env)
    intruder = gl.sleeper()
    gl.write_fake_gpus([{"processes": [{"pid": intruder.popen.pid}]}, {}])
    server = start_serve(gl, env=env)
    browser.call("Page.navigate", url="http://127.0.0.1:%d/" % server.port)
    alerts_js = "Array.from(document.querySelectorAll('#alerts li')).map(li => li.textContent)"

    def both_shown():
        items = browser.evaluate(alerts_js) or []
        idle = [t for t in items if t.startswith("idle: GPU 0 leased by %s" % ME)]
        intruding = [t for t in items if t == "intruder: pid %d (%s) on GPU 0 leased by %s "
                     "(lease %s)" % (intruder.popen.pid, ME, ME, lease_id)]
        return items if idle and intruding else None
    wait_until(both_shown, timeout=HANG, what="the idle GPU and the intruder on the page")
    browser.screenshot(str(gl.tmp / "dashboard-alerts.png"))


def test_usage_chart_shows_the_journals_gpu_hours(gl, browser):
    """A lease that ran before the page was opened is in the chart, from the usage journal."""
    env = gl.env(fake="1")
    result = gl.run("run", "-n", "1", "--", "sleep", "0.2", env=env)
    assert result.returncode == 0, result.stderr
    server = start_serve(gl, env=env)
    browser.call("Page.navigate", url="http://127.0.0.1:%d/" % server.port)
    today = time.strftime("%Y-%m-%d", time.gmtime())
    titles_js = ("Array.from(document.querySelectorAll('#usage svg rect title'))"
                 ".map(t => t.textContent)")
    titles = wait_until(lambda: browser.evaluate(titles_js), timeout=HANG,
                        what="the usage chart drawn from the journal")
    assert [t.split(":")[0] for t in titles] == ["%s, %s" % (ME, today)], titles


def test_usage_chart_draws_gpu_hours_per_user_per_day(gl, browser):
    # The page's own drawing function with a document in the documented shape: several users
    # and days, which one machine's journal in a test does not have.
    server = start_serve(gl, env=gl.env(fake="1"))
    browser.call("Page.navigate", url="http://127.0.0.1:%d/" % server.port)
    wait_until(lambda: browser.evaluate("typeof renderUsage") == "function", timeout=HANG,
               what="the dashboard's script")
    titles = browser.evaluate("""(() => {
      renderUsage({rows: [
        {user: "alice", day: "2026-11-01", gpu_hours: 5.5},
        {user: "bob", day: "2026-11-01", gpu_hours: 2},
        {user: "alice", day: "2026-11-02", gpu_hours: 1}]});
      return Array.from(document.querySelectorAll('#usage svg rect title'))
                  .map(t => t.textContent);
    })()""")
    assert sorted(titles) == ["alice, 2026-11-01: 5.50 GPU-hours",
                              "alice, 2026-11-02: 1.00 GPU-hours",
                              "bob, 2026-11-01: 2.00 GPU-hours"]
    browser.screenshot(str(gl.tmp / "dashboard-usage.png"))


def test_markup_in_a_label_is_shown_as_text_never_run(gl, browser):
    # Labels, commands and user names come from anyone who can take a lease: the page must put
    # them in as text. Were one parsed as HTML, the image's onerror would set window.pwned.
    label = '<img src=x onerror="window.pwned=1"><b>bold</b>'
    env = gl.env(fake="2")
    gl.hold("--gpus", "0", env=env, label=label)
    server = start_serve(gl, env=env)
    browser.call("Page.navigate", url="http://127.0.0.1:%d/" % server.port)
    shown = wait_until(lambda: (lambda s: s if s and s["state"] == "leased" else None)(
        page_state(browser)), timeout=HANG, what="the dashboard to show GPU 0 leased")
    assert shown["label"] == label
    assert browser.evaluate("document.querySelectorAll('#gpus img, #gpus b').length") == 0
    assert browser.evaluate("window.pwned === undefined") is True


def test_dashboard_names_foreign_processes_and_what_waiters_wait_for(gl, browser):
    """Issue 41, defect 14: a GPU busy with a process outside gpulock showed a blank holder;
    the queue table had no reason and no command."""
    stranger = gl.sleeper()
    path = gl.write_fake_gpus([{}, {"processes": [{"pid": stranger.popen.pid}]}])
    env = gl.env(fake=path)
    gl.hold("--gpus", "0", env=env)
    gl.spawn("run", "--gpus", "0", "--label", "second", "--", "sleep", "4242", env=env)
    wait_until(lambda: json.loads(gl.run("queue", "--json", env=env).stdout)["waiting"], HANG,
               what="the second request to queue")
    server = start_serve(gl, env=env)
    browser.call("Page.navigate", url="http://127.0.0.1:%d/" % server.port)

    def shown():
        return browser.evaluate("""(() => {
          const busy = document.querySelector('#gpus tr[data-gpu="1"] .holder');
          const waiter = document.querySelector('#queue tbody tr');
          if (!busy || !waiter || !waiter.querySelector('.waits-for')) return null;
          return {busy: busy.textContent,
                  waits: waiter.querySelector('.waits-for').textContent,
                  command: waiter.querySelector('.command').textContent};
        })()""")
    page = wait_until(shown, timeout=HANG, what="the foreign process and the waiter on the page")
    assert page["busy"] == "foreign: pid %d (%s)" % (stranger.popen.pid, ME), page
    assert "GPU 0" in page["waits"] and "leased by %s" % ME in page["waits"], page
    assert page["command"].startswith("sleep"), page
