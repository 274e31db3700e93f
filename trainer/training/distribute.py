"""The one place that builds the tf.distribute strategy and answers who is the chief."""

import json
import os
from typing import Optional

import tensorflow as tf


def cluster_workers() -> int:
    """Number of workers that TF_CONFIG names (0 when unset)."""
    cluster = json.loads(os.environ.get("TF_CONFIG", "{}")).get("cluster", {})
    return len(cluster.get("worker", [])) + len(cluster.get("chief", []))


def split_cpu(num_replicas: int):
    """Splits the CPU into `num_replicas` logical devices (before TF initialises devices)."""
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(num_replicas)])


def make_strategy(num_cpu_replicas: int = 0) -> tf.distribute.Strategy:
    """MultiWorkerMirroredStrategy when TF_CONFIG names several workers, else
    MirroredStrategy over all local GPUs, or over `num_cpu_replicas` logical CPUs
    (exercising the multi-replica code without GPUs), or over the one CPU."""
    if num_cpu_replicas > 1:
        split_cpu(num_cpu_replicas)
    if cluster_workers() > 1:
        return tf.distribute.MultiWorkerMirroredStrategy()
    if num_cpu_replicas > 1:
        return tf.distribute.MirroredStrategy(
            [f"/cpu:{i}" for i in range(num_cpu_replicas)])
    if tf.config.list_physical_devices("GPU"):
        return tf.distribute.MirroredStrategy()
    return tf.distribute.MirroredStrategy(["/cpu:0"])


def is_chief(strategy: Optional[tf.distribute.Strategy] = None) -> bool:
    """True for the worker that writes checkpoints, summaries and exports."""
    if cluster_workers() <= 1:
        return True
    task = json.loads(os.environ["TF_CONFIG"]).get("task", {})
    has_chief = "chief" in json.loads(os.environ["TF_CONFIG"]).get("cluster", {})
    return task.get("type") == "chief" or (not has_chief and task.get("type") == "worker"
                                           and task.get("index", 0) == 0)


def worker_dir(model_dir: str) -> str:
    """Where this worker saves checkpoints: the model directory for the chief, a scratch
    directory for the others (every worker must take part in saving, only one keeps it)."""
    if is_chief():
        return model_dir
    task = json.loads(os.environ["TF_CONFIG"])["task"]
    return os.path.join(model_dir, f"workertemp_{task['type']}_{task['index']}")
