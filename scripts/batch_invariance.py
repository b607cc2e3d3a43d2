"""Whether a prompt decodes to the same tokens alone as in a batch (sjd/bench/batch_invariance.py).

python scripts/batch_invariance.py MODEL DECODER [--prompts 4] [--seed 0] [--float64] [--check]
"""

import sys

from sjd.bench.batch_invariance import main

if __name__ == "__main__":
    sys.exit(main())
