"""The man page, docs/gpulock.1 (issue 17): it renders without warnings, and it cannot drift
from the CLI: its SYNOPSIS names exactly the options each command's --help lists, every option
is described under OPTIONS, and every environment variable and exit status of docs/cli.md is
there."""

import os
import pathlib
import re
import shutil
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
MANUAL = REPO / "docs" / "gpulock.1"

OPTION = re.compile(r"(?<![\w-])(--?[A-Za-z][\w-]*)")


def render(width=80, path=MANUAL):
    """The page as man(1) shows it, plain text, `width` columns; fails on any groff warning."""
    env = dict(os.environ, MANWIDTH=str(width), MAN_KEEP_FORMATTING="0", LC_ALL="C.UTF-8")
    result = subprocess.run(["man", "--warnings=all", "-l", str(path)], env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stderr == "", "man page warnings:\n" + result.stderr
    # man does not add overstriking when its output is not a terminal; drop any anyway.
    return re.sub(r".\x08", "", result.stdout)


def sections(text):
    """{SECTION NAME: its lines} of a rendered page."""
    out, name = {}, None
    for line in text.splitlines():
        if re.fullmatch(r"[A-Z][A-Z ]+", line):
            name = line
            out[name] = []
        elif name:
            out[name].append(line)
    return out


def synopsis_options():
    """{command: options its SYNOPSIS entry names}, from the page rendered wide enough that
    each entry is one line."""
    found = {}
    for line in sections(render(width=1000))["SYNOPSIS"]:
        match = re.match(r"\s+gpulock(?: ([a-z]+))?(.*)", line)
        if match:
            found[match.group(1) or ""] = set(OPTION.findall(match.group(2)))
    return found


def help_options(gpulock_bin, *command):
    result = subprocess.run([gpulock_bin, *command, "--help"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    options = result.stdout.split("Options:", 1)[1].split("Subcommands:", 1)[0]
    return set(OPTION.findall(options))


def commands(gpulock_bin):
    text = subprocess.run([gpulock_bin, "--help"], capture_output=True, text=True).stdout
    listed = text.split("Subcommands:", 1)[1]
    return [m.group(1) for m in re.finditer(r"^\s+([a-z]+)\s", listed, re.M)]


def test_renders_without_warnings():
    assert "gpulock - exclusive GPU leases" in render()
    result = subprocess.run(["groff", "-man", "-Tutf8", "-ww", "-z", str(MANUAL)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stderr == "", result.stderr


def test_fits_80_columns():
    for line in render(80).splitlines():
        assert len(line) <= 80, line


def test_has_the_usual_sections():
    assert set(sections(render())) >= {"NAME", "SYNOPSIS", "DESCRIPTION", "COMMANDS", "OPTIONS",
                                       "ENVIRONMENT", "FILES", "EXIT STATUS", "EXAMPLES",
                                       "SEE ALSO"}


def test_version_is_the_binarys(gpulock_bin):
    version = subprocess.run([gpulock_bin, "--version"], capture_output=True,
                             text=True).stdout.split()[1]
    assert re.search(r'^\.TH GPULOCK 1 \S+ "gpulock %s"' % re.escape(version),
                     MANUAL.read_text(), re.M)


def test_synopsis_names_every_command(gpulock_bin):
    listed = commands(gpulock_bin)
    assert "run" in listed and "__complete" not in listed
    assert set(synopsis_options()) == set(listed) | {""}


def test_synopsis_options_are_exactly_the_clis(gpulock_bin):
    """Each command's SYNOPSIS entry names the options its --help lists (less -h/--help, which
    every command has and the page says once), and no others."""
    synopsis = synopsis_options()
    for command in commands(gpulock_bin):
        accepted = help_options(gpulock_bin, command) - {"-h", "--help"}
        assert synopsis[command] == accepted, command
    assert synopsis[""] == help_options(gpulock_bin)


def test_every_option_is_described(gpulock_bin):
    """Every option of every command has an entry (a tagged paragraph) under OPTIONS, and every
    entry there is an option the CLI accepts."""
    described = set()
    for line in sections(render())["OPTIONS"]:
        tag = re.match(r" {7}(-\S.*)", line)  # a tag sits at the section's indent
        if tag:
            described |= set(OPTION.findall(tag.group(1).split("  ")[0]))
    accepted = help_options(gpulock_bin)
    for command in commands(gpulock_bin):
        accepted |= help_options(gpulock_bin, command)
    assert described == accepted


def test_every_command_is_described(gpulock_bin):
    described = {line.split()[0] for line in sections(render())["COMMANDS"]
                 if re.match(r" {7}[a-z]", line)}
    assert described == set(commands(gpulock_bin))


def test_environment_and_exit_statuses_match_the_reference():
    reference = (REPO / "docs" / "cli.md").read_text()
    environment = reference.split("## Environment", 1)[1]
    variables = set(re.findall(r"^\| `([A-Z_]+)`", environment, re.M))
    assert "GPULOCK_DIR" in variables and "GPULOCK_BACKEND" in variables
    page = sections(render())
    documented = {line.strip() for line in page["ENVIRONMENT"] if re.match(r" {7}[A-Z_]+$", line)}
    assert documented == variables
    statuses = set(re.findall(r"^\| (\d+) \|", reference.split("## Exit status", 1)[1], re.M))
    shown = {line.strip() for line in page["EXIT STATUS"] if re.match(r" {7}\d+\b", line)}
    shown = {s.split()[0] for s in shown}
    assert statuses <= shown and {"64", "69", "70", "75", "78"} <= shown
