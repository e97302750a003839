"""Shared GPU leases (by memory, issue 15) in the monitoring views of issue 16: the metrics'
per-GPU shared gauges and per-lease over-reservation gauge (`gpulock metrics` and serve's
/metrics, parsed with prometheus_client), serve's /api/status hiding shared leases' command
lines, and the dashboard in headless Chromium showing a GPU in shared use with its leases and
its reserved and free memory. The test sets the reservations and the simulated driver's
per-process memory itself; that is what the views are checked against."""

import json
import os
import pwd

from conftest import wait_until
from test_dashboard import browser  # noqa: F401 (a fixture)
from test_lease_counters import parse, served_metrics, start_serve
from test_serve import get

ME = pwd.getpwuid(os.getuid()).pw_name
GIB = 1 << 30
LABEL = '<img src=x onerror="window.injected=1">'  # must show as text, never as markup


def start_shared_job(gl, env, memory, name, label=None):
    """`gpulock run --mem MEMORY -- sh -c ...` whose command writes its pid; (bg, pid)."""
    pid_file = gl.tmp / (name + ".pid")
    script = 'echo $$ > "$1.tmp" && mv "$1.tmp" "$1"; exec sleep 1000'
    args = ["run", "--mem", memory, "--on-over-memory", "warn"]
    if label:
        args += ["--label", label]
    bg = gl.spawn(*args, "--", "sh", "-c", script, "secret-argument", pid_file, env=env)
    wait_until(lambda: pid_file.exists() or not bg.alive(), what="the shared job to start")
    assert bg.alive(), bg.describe()
    return bg, int(pid_file.read_text())


def shared_world(gl):
    """One simulated 80 GiB GPU with 5 GiB kept back, two shared jobs (10 and 20 GiB), the
    second using 25 GiB (over its reservation). Returns (env, lease ids by size)."""
    gl.write_fake_gpus([{"memory_total": "80G"}])
    config = gl.tmp / "config.toml"
    config.write_text('shared_memory_reserve = "5G"\n')
    env = gl.env(fake=str(gl.fake_path), GPULOCK_CONFIG=config)
    _, small_pid = start_shared_job(gl, env, "10G", "small", label=LABEL)
    _, big_pid = start_shared_job(gl, env, "20G", "big")
    gl.write_fake_gpus([{"memory_total": "80G", "processes": [
        {"pid": small_pid, "used_memory": "1G"}, {"pid": big_pid, "used_memory": "25G"}]}])
    leases = {lease["memory_bytes"]: lease["lease_id"]
              for lease in gl.gpu_status(0, env=env)["shared"]["leases"]}
    assert sorted(leases) == [10 * GIB, 20 * GIB]
    return env, leases


def check_shared_metrics(values, leases):
    def one(name, **labels):
        wanted = set(labels.items()) | {("gpu", "0")}
        found = [v for (n, ls), v in values.items() if n == name and wanted <= ls]
        assert len(found) == 1, (name, labels, found)
        return found[0]
    assert one("gpulock_gpu_shared_jobs") == 2
    assert one("gpulock_gpu_shared_reserved_bytes") == 30 * GIB
    assert one("gpulock_gpu_shared_unreserved_bytes") == (80 - 30 - 5) * GIB
    small, big = leases[10 * GIB], leases[20 * GIB]
    assert one("gpulock_shared_lease_reserved_bytes", lease_id=small, user=ME) == 10 * GIB
    assert one("gpulock_shared_lease_over_reservation", lease_id=small, user=ME) == 0
    assert one("gpulock_shared_lease_over_reservation", lease_id=big, user=ME) == 1


def test_metrics_show_shared_use_and_over_reservation(gl):
    env, leases = shared_world(gl)
    result = gl.run("metrics", env=env)
    assert result.returncode == 0, result.stderr
    values, types = parse(result.stdout)
    assert types["gpulock_shared_lease_over_reservation"] == "gauge"
    check_shared_metrics(values, leases)

    server = start_serve(gl, env)
    wait_until(lambda: ("gpulock_gpu_shared_jobs" in served_metrics(server)),
               what="serve's metrics to show the shared GPU")
    check_shared_metrics(parse(served_metrics(server))[0], leases)
    # serve shows shared leases' programs, never their arguments (serve_show_commands off).
    served = json.loads(get(server.port, "/api/status")[2])
    commands = [lease["command"] for lease in served["gpus"][0]["shared"]["leases"]]
    assert commands == ["sh", "sh"], commands
    assert "secret-argument" not in json.dumps(served)


def test_gpus_shows_what_shared_leases_reserve(gl):
    env, _ = shared_world(gl)
    result = gl.run("gpus", "--json", env=env)
    assert result.returncode == 0, result.stderr
    gpu = json.loads(result.stdout)["gpus"][0]
    assert gpu["state"] == "leased"
    assert gpu["shared"] == {"jobs": 2, "reserved_bytes": 30 * GIB,
                             "admin_reserve_bytes": 5 * GIB,
                             "unreserved_bytes": (80 - 30 - 5) * GIB}
    text = gl.run("gpus", env=env)
    assert text.returncode == 0, text.stderr
    row = [line for line in text.stdout.splitlines() if line.startswith("0 ")]
    assert len(row) == 1 and "2 jobs, 30.0 GiB reserved, 45.0 GiB left" in row[0], text.stdout


def test_gpus_lists_the_devices_when_the_lease_states_cannot_be_read(gl):
    env = gl.env(GPULOCK_BACKEND="redis://127.0.0.1:1/0")  # nobody listens there
    result = gl.run("gpus", "--json", env=env)
    assert result.returncode == 0, result.stderr
    assert "lease states unknown" in result.stderr
    gpus = json.loads(result.stdout)["gpus"]
    assert len(gpus) == 4 and all(g["state"] is None and g["shared"] is None for g in gpus)


def test_dashboard_shows_a_gpu_in_shared_use(gl, browser):  # noqa: F811
    env, leases = shared_world(gl)
    server = start_serve(gl, env)
    browser.call("Page.navigate", url="http://127.0.0.1:%d/" % server.port)
    row_js = """(() => {
      const row = document.querySelector('#gpus tr[data-gpu="0"]');
      if (!row || !row.dataset.shared) return null;
      return {jobs: row.dataset.shared,
              summary: row.querySelector('.shared-summary').textContent,
              leases: Array.from(row.querySelectorAll('.shared-lease')).map(
                  d => ({id: d.dataset.lease, text: d.textContent,
                         over: d.classList.contains('over')})),
              label: row.querySelector('.label').textContent,
              images: row.querySelectorAll('img').length,
              injected: window.injected || null};
    })()"""
    shown = wait_until(lambda: browser.evaluate(row_js), what="the shared GPU on the page")
    assert shown["jobs"] == "2"
    assert shown["summary"] == ("shared by 2 leases: 30.0 GiB reserved, "
                                "45.0 GiB free to reserve")
    by_id = {lease["id"]: lease for lease in shown["leases"]}
    small, big = leases[10 * GIB], leases[20 * GIB]
    assert by_id[small] == {"id": small, "text": "%s (%s) 10.0 GiB" % (ME, small),
                            "over": False}
    assert by_id[big] == {"id": big, "text": "%s (%s) 20.0 GiB OVER: uses 25.0 GiB" % (ME, big),
                          "over": True}
    assert shown["label"] == LABEL  # as text
    assert shown["images"] == 0 and shown["injected"] is None
    browser.screenshot(str(gl.tmp / "dashboard-shared.png"))
