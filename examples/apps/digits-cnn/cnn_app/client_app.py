"""ClientApp: fine-tunes the global CNN on this cluster's data only."""

from __future__ import annotations

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict

from workloads.sdk import PlatformClientApp, agent_metrics, data_dir

from .task import DigitsCNN, evaluate, load_data, number, train

# Scores the received model inside the train call when the server asks (evaluate-in-train).
app = PlatformClientApp(mods=[agent_metrics])


@app.train()
def train_handler(msg: Message, context: Context) -> Message:
    """Train the received model on the local data."""
    model = DigitsCNN()
    model.load_state_dict(msg.content.array_records["arrays"].to_torch_state_dict())
    x, y = load_data(data_dir(context))
    config, node = context.run_config, context.node_config
    loss, accuracy = train(
        model,
        x,
        y,
        epochs=int(number(node.get("local-epochs", config["local-epochs"]))),
        lr=number(node.get("lr", config["lr"])),
        batch_size=int(number(node.get("batch-size", config["batch-size"]))),
        seed=int(number(msg.content.config_records["config"]["server-round"])),
    )
    metrics = MetricRecord({"train-loss": loss, "train-accuracy": accuracy, "num-examples": len(y)})
    reply = RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": metrics})
    return Message(reply, reply_to=msg)


@app.evaluate()
def evaluate_handler(msg: Message, context: Context) -> Message:
    """Evaluate the received model on the local data."""
    model = DigitsCNN()
    model.load_state_dict(msg.content.array_records["arrays"].to_torch_state_dict())
    x, y = load_data(data_dir(context))
    loss, accuracy = evaluate(model, x, y)
    metrics = MetricRecord({"eval-loss": loss, "eval-accuracy": accuracy, "num-examples": len(y)})
    return Message(RecordDict({"metrics": metrics}), reply_to=msg)
