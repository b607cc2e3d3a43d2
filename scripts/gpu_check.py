"""The device check: every stage of sjd/bench/gpu_check.py, one JSON line each (its docstring says what each does).

python scripts/gpu_check.py --out results/gpu              # on a GPU: about 7 minutes (--deadline-s 420)
python scripts/gpu_check.py --tiny --device cpu            # the same stages on tiny configs, on the CPU
"""

from sjd.bench.gpu_check import main

if __name__ == "__main__":
    main()
