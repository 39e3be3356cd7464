#!/usr/bin/env bash
# The two set-up commands of the README, from a fresh clone on a machine with Python 3.11:
#
#   ./run.sh demo [demo args]     install what is missing into .venv, then `foundation demo`
#   ./run.sh test [pytest args]   install what is missing into .venv, then the test suite (what CI runs)
#
# The install is skipped when .venv already holds what pyproject.toml asks for (a stamp keyed on
# the hash of pyproject.toml, setup.py and this file), so both verbs are fast the second time.
# FOUNDATION_VENV=DIR uses another virtual environment.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="${FOUNDATION_VENV:-$root/.venv}"

install() {
    # the stamp covers the packaging files and these install lines (this file) together
    local key
    key="$(cat "$root/pyproject.toml" "$root/setup.py" "${BASH_SOURCE[0]}" | sha256sum | cut -c1-16)"
    if [[ -x "$venv/bin/python" && -f "$venv/.foundation-installed" && "$(cat "$venv/.foundation-installed")" == "$key" ]]; then
        return 0
    fi
    if [[ ! -x "$venv/bin/python" ]]; then
        local py
        py="$(command -v python3.11 || command -v python3 || true)"
        if [[ -z "$py" ]] || ! "$py" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
            echo "run.sh: needs Python 3.11 (python3.11 on PATH); found: ${py:-none}" >&2
            exit 2
        fi
        echo "run.sh: creating $venv" >&2
        "$py" -m venv "$venv"
    fi
    echo "run.sh: installing what is missing into $venv (the first time: ~5 min, 7.8 GB) ..." >&2
    local pip=("$venv/bin/python" -m pip install --disable-pip-version-check -q)
    "${pip[@]}" 'pip<25'                            # ESPnet's dependency ci_sdr declares a git-URL extra that pip >= 25 rejects
    "${pip[@]}" -e "$root[all,test]"                # the package, the `foundation` command, every extra
    "${pip[@]}" --no-deps torchscale==0.3.0         # official Magneto code; its own pins (timm 0.6, fairscale) conflict
    # an editable install leaves out setup.py's data file: the start-up hook that lets mmseg
    # import on mmcv-lite (foundation_tasks/segmentation/mmseg_autoinstall.py)
    cp "$root/foundation_tasks/segmentation/foundation_mmseg.pth" \
        "$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/"
    echo "$key" > "$venv/.foundation-installed"
}

verb="${1:-}"
case "$verb" in
    demo)
        install
        shift
        # data/ and runs/ go to the directory the command was started from
        exec "$venv/bin/foundation" demo "$@"
        ;;
    test)
        install
        shift
        cd "$root"
        exec "$venv/bin/python" -m pytest -q "$@"
        ;;
    *)
        echo "usage: ./run.sh demo [foundation demo args] | ./run.sh test [pytest args]" >&2
        exit 2
        ;;
esac
