"""ClientApp: trains and evaluates the global model on this cluster's data only."""

from __future__ import annotations

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict

from workloads.sdk import PlatformClientApp, agent_metrics, data_dir

from .task import build_model, evaluate, load_data, number, setting, train

# Scores the received model inside the train call when the server asks (evaluate-in-train).
app = PlatformClientApp(mods=[agent_metrics])


@app.train()
def train_handler(msg: Message, context: Context) -> Message:
    """Train the received model on the local data."""
    model = build_model()
    model.load_state_dict(msg.content.array_records["arrays"].to_torch_state_dict())
    x, y = load_data(data_dir(context))
    config = msg.content.config_records["config"]
    run, node = context.run_config, context.node_config
    scores = train(
        model,
        x,
        y,
        epochs=int(setting(run, node, "local-epochs")),
        lr=float(setting(run, node, "lr")),
        batch_size=int(setting(run, node, "batch-size")),
        proximal_mu=number(config.get("proximal-mu", 0.0)),
        seed=int(number(run["seed"]) + number(config["server-round"])),
    )
    metrics = MetricRecord(
        {
            "train-loss": scores.loss,
            "train-accuracy": scores.accuracy,
            "num-examples": scores.samples,
        }
    )
    arrays = ArrayRecord(model.state_dict())
    return Message(RecordDict({"arrays": arrays, "metrics": metrics}), reply_to=msg)


@app.evaluate()
def evaluate_handler(msg: Message, context: Context) -> Message:
    """Evaluate the received model on the local data."""
    model = build_model()
    model.load_state_dict(msg.content.array_records["arrays"].to_torch_state_dict())
    scores = evaluate(model, *load_data(data_dir(context)))
    metrics = MetricRecord(
        {"eval-loss": scores.loss, "eval-accuracy": scores.accuracy, "num-examples": scores.samples}
    )
    return Message(RecordDict({"metrics": metrics}), reply_to=msg)
