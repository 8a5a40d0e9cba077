"""TensorBoard, stopping when the process that started it dies (see toolkit.parent_watch).

python -m toolkit.runs.tensorboard_main --logdir RUN_DIR --host 127.0.0.1 --port P   # tensorboard's own arguments
"""

from __future__ import annotations

from toolkit.parent_watch import stop_with_parent

if __name__ == "__main__":
    stop_with_parent()
    from tensorboard.main import run_main

    run_main()
