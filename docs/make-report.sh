#!/bin/sh
# Regenerate docs/report.html from the committed results listed in docs/report-sources.txt.
# From the repository root:  sh docs/make-report.sh   (any Python with tilefuse's requirements and matplotlib)
set -e
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} $PYTHON -m tilefuse.cli report \
  $(sed -e 's/#.*//' docs/report-sources.txt) --title "tilefuse results (NVIDIA H200; attention, models and the 1024-row compiler graphs on an H100)" -o docs/report.html
