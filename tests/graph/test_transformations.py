"""Partitioning: the key selector's label is taken where the job is built."""

from __future__ import annotations

import pickle

import cloudpickle

from epochstream.graph.transformations import Partitioning


def test_a_hash_edge_names_its_selector_with_the_file_it_was_written_in() -> None:
    def tags(record: dict) -> list:
        return record["tags"]

    edge = Partitioning("hash", tags)
    label = edge.selector_label
    assert label.startswith(
        "test_a_hash_edge_names_its_selector_with_the_file_it_was_written_in.<locals>.tags"
    )
    assert "(test_transformations.py:" in label


def test_the_label_survives_shipping_the_selector_by_value() -> None:
    """cloudpickle ships a function by value with its code named ``<dynamic-code>`` (3.1.3):
    the label taken before shipping still names the real file and line."""
    edge = Partitioning("hash", lambda r: r[0])
    shipped = pickle.loads(cloudpickle.dumps(edge))
    assert shipped.selector_label == edge.selector_label
    assert "test_transformations.py:" in shipped.selector_label
    assert shipped.key_selector((7, 1)) == 7


def test_edges_without_a_selector_have_no_label() -> None:
    assert Partitioning().selector_label == ""
    assert Partitioning("rebalance") == Partitioning("rebalance")
