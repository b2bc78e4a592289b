#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder image.
#
# The autograder zip holds, at its root: setup.sh, run_autograder, rubric.toml, the rubric's
# reference solution (as rubric.toml names it, e.g. reference/attention.py), and
# attention-conformance/ (this repository). Gradescope unpacks it into /autograder/source.
set -euo pipefail

apt-get update
apt-get install -y --no-install-recommends python3 python3-venv python3-pip
# The filesystem sandbox for student code. Where Gradescope's container can't use it (no
# namespaces), the kernel's Landlock serves; grading refuses only where neither works.
apt-get install -y --no-install-recommends bubblewrap \
    || echo "bubblewrap could not be installed: student code will run under Landlock"
python3 -m venv /autograder/venv
cd /autograder/source/attention-conformance
# The CPU build of torch, pinned through constraints.txt like every install of this project.
/autograder/venv/bin/pip install --quiet -c constraints.txt \
    --extra-index-url https://download.pytorch.org/whl/cpu torch==2.13.0
/autograder/venv/bin/pip install --quiet -c constraints.txt .

# Fail the build, not the students, when the rubric can't tell a correct solution from the
# bundled mutants (the reference must get full marks; every graded bug must cost its points).
cd /autograder/source
/autograder/venv/bin/attention-conformance grade --self-test --rubric rubric.toml
