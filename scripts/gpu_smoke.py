"""GPU smoke check: every real architecture at its real size, random weights, through our adapters; what it
measures is in sjd/bench/gpu_smoke.py. The device check, scripts/gpu_check.py, is its successor.

    python scripts/gpu_smoke.py [--models lumina,anole,emu3,janus,llamagen] [--out results/gpu_forward_latency.csv]
    python scripts/gpu_smoke.py --device cpu --tiny --out /tmp/gpu_smoke_tiny.csv   # the same code, tiny widths
"""

from sjd.bench.gpu_smoke import main

if __name__ == "__main__":
    main()
