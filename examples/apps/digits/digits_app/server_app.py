"""ServerApp: FedAvg (or FedProx) through the platform's strategy loop."""

from __future__ import annotations

import time
from pathlib import Path

from flwr.app import ArrayRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp

from workloads.sdk import FedAvg, FedProx, run_strategy

from .task import build_model, evaluate, load_data, number

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Train for num-server-rounds; the platform checkpoints, resumes and stores the model."""
    config = context.run_config
    model = build_model(int(number(config["seed"])))
    fraction_train = number(config["fraction-train"])
    # Client evaluation inside the train call (one phase per round), or Flower's separate
    # evaluation phase with evaluate-in-train = false.
    folded = bool(config["evaluate-in-train"])
    fraction_evaluate = 0.0 if folded else number(config["fraction-evaluate"])
    strategy = (
        FedProx(
            fraction_train=fraction_train,
            fraction_evaluate=fraction_evaluate,
            proximal_mu=number(config["proximal-mu"]),
        )
        if config["strategy"] == "fedprox"
        else FedAvg(fraction_train=fraction_train, fraction_evaluate=fraction_evaluate)
    )
    test_dir = str(config["test-dir"])
    # A floor on each round's duration (0: none). Rounds otherwise last as long as the
    # machine makes them; a run that must span a known time (the certificate-rotation drill)
    # cannot count on that.
    round_min_s = number(config["round-min-seconds"])
    last_round_end = time.monotonic()

    def held_out(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        """Accuracy on the server's held-out data, when the run config names it; called
        before round 1 and after every round, so it also holds a round to round-min-seconds."""
        nonlocal last_round_end
        if server_round > 0:
            time.sleep(max(0.0, last_round_end + round_min_s - time.monotonic()))
        last_round_end = time.monotonic()
        if not test_dir:
            return None
        model.load_state_dict(arrays.to_torch_state_dict())
        scores = evaluate(model, *load_data(Path(test_dir)))
        return MetricRecord({"test-loss": scores.loss, "test-accuracy": scores.accuracy})

    run_strategy(
        strategy,
        grid,
        initial_arrays=ArrayRecord(model.state_dict()),
        num_rounds=int(number(config["num-server-rounds"])),
        evaluate_fn=held_out,
        evaluate_in_train=folded and number(config["fraction-evaluate"]) > 0,
        wire_dtype=str(config.get("wire-dtype", "float32")),
    )
