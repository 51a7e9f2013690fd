"""parallel.tensor's framework-free core (hvdcls.maths.tensor_parallel): the ranks' layout and the
Megatron split of a ViT encoder block's weights, and back to torchvision's keys; the config's
refusals."""
import numpy as np
import pytest

from hvdcls import config as cfg
from hvdcls.errors import UserError
from hvdcls.maths import tensor_parallel as tp

BLOCK = "encoder.layers.encoder_layer_0."


def block_state(hidden=8, mlp=16, seed=0) -> dict:
    """One torchvision EncoderBlock's entries and a few outside it, random."""
    rng = np.random.default_rng(seed)
    shapes = {"ln_1.weight": (hidden,), "ln_1.bias": (hidden,),
              "self_attention.in_proj_weight": (3 * hidden, hidden), "self_attention.in_proj_bias": (3 * hidden,),
              "self_attention.out_proj.weight": (hidden, hidden), "self_attention.out_proj.bias": (hidden,),
              "ln_2.weight": (hidden,), "ln_2.bias": (hidden,), "mlp.0.weight": (mlp, hidden), "mlp.0.bias": (mlp,),
              "mlp.3.weight": (hidden, mlp), "mlp.3.bias": (hidden,)}
    state = {BLOCK + k: rng.standard_normal(s) for k, s in shapes.items()}
    state.update({"class_token": rng.standard_normal((1, 1, hidden)), "encoder.ln.weight": rng.standard_normal(hidden),
                  "heads.head.weight": rng.standard_normal((3, hidden))})
    return state


def test_layout_of_four_ranks_in_two_replicas():
    layout = tp.Layout(4, 2)
    assert layout.replicas == 2
    assert [layout.replica(r) for r in range(4)] == [0, 0, 1, 1]
    assert [layout.tensor_rank(r) for r in range(4)] == [0, 1, 0, 1]
    assert layout.group(3) == (2, 3) and layout.group(0) == (0, 1)
    assert layout.data_set(0) == (0, 2) and layout.data_set(3) == (1, 3)
    assert layout.process_sets() == [(0, 1), (2, 3), (0, 2), (1, 3)]


def test_layout_leaves_the_whole_world_to_horovods_global_set():
    assert tp.Layout(2, 2).process_sets() == [(0,), (1,)]  # one replica: each data set one rank
    assert tp.Layout(2, 1).process_sets() == [(0,), (1,)]
    assert tp.Layout(6, 3).process_sets() == [(0, 1, 2), (3, 4, 5), (0, 3), (1, 4), (2, 5)]


@pytest.mark.parametrize("size,tensor", [(3, 2), (2, 4), (4, 0)])
def test_layout_refuses_what_does_not_divide(size, tensor):
    with pytest.raises(UserError, match="parallel.tensor"):
        tp.Layout(size, tensor)


def test_both_backends_are_taken_at_the_start():
    assert tp.check_run(2, "tensorflow", 4).replicas == 2
    assert tp.check_run(2, "torch", 2).replicas == 1
    with pytest.raises(UserError, match="built for torch and tensorflow"):
        tp.check_run(2, "jax", 2)


TF_BLOCK = "encoder_layer_1/"


def tf_block(hidden=8, heads=4, mlp=16, seed=0) -> dict:
    """One tf_backend/vit.py EncoderBlock's variables by Keras path, and a few outside it, random."""
    rng = np.random.default_rng(seed)
    head = hidden // heads
    shapes = {"ln_1/gamma": (hidden,), "self_attention/attention_output/bias": (hidden,), "mlp_1/kernel": (hidden, mlp),
              "mlp_1/bias": (mlp,), "mlp_2/kernel": (mlp, hidden), "mlp_2/bias": (hidden,),
              "self_attention/attention_output/kernel": (heads, head, hidden)}
    shapes.update({f"self_attention/{p}/kernel": (hidden, heads, head) for p in ("query", "key", "value")})
    shapes.update({f"self_attention/{p}/bias": (heads, head) for p in ("query", "key", "value")})
    state = {TF_BLOCK + k: rng.standard_normal(s) for k, s in shapes.items()}
    state.update({"tokens/class_token": rng.standard_normal((1, 1, hidden)),
                  "head/kernel": rng.standard_normal((hidden, 3))})
    return state


def test_tf_block_is_cut_by_heads_and_units_and_its_row_layers_by_input_rows():
    state = tf_block()
    second = tp.split_state(state, 2, 1)
    for p in ("query", "key", "value"):  # heads 2 and 3 of each
        np.testing.assert_array_equal(second[f"{TF_BLOCK}self_attention/{p}/kernel"],
                                      state[f"{TF_BLOCK}self_attention/{p}/kernel"][:, 2:])
        np.testing.assert_array_equal(second[f"{TF_BLOCK}self_attention/{p}/bias"],
                                      state[f"{TF_BLOCK}self_attention/{p}/bias"][2:])
    np.testing.assert_array_equal(second[TF_BLOCK + "self_attention/attention_output/kernel"],
                                  state[TF_BLOCK + "self_attention/attention_output/kernel"][2:])
    np.testing.assert_array_equal(second[TF_BLOCK + "mlp_1/kernel"], state[TF_BLOCK + "mlp_1/kernel"][:, 8:])
    np.testing.assert_array_equal(second[TF_BLOCK + "mlp_1/bias"], state[TF_BLOCK + "mlp_1/bias"][8:])
    np.testing.assert_array_equal(second[TF_BLOCK + "mlp_2/kernel"], state[TF_BLOCK + "mlp_2/kernel"][8:])
    for whole in ("mlp_2/bias", "ln_1/gamma", "self_attention/attention_output/bias"):
        assert second[TF_BLOCK + whole] is state[TF_BLOCK + whole]
    for whole in ("tokens/class_token", "head/kernel"):
        assert second[whole] is state[whole]


@pytest.mark.parametrize("tensor", [2, 4])
def test_tf_split_then_join_gives_back_the_whole_block(tensor):
    state = tf_block()
    joined = tp.join_states([tp.split_state(state, tensor, t) for t in range(tensor)])
    for key, value in state.items():
        np.testing.assert_array_equal(joined[key], value)


def test_keras_optimizer_slots_are_cut_as_their_variable():
    paths = ["encoder_layer_1/mlp_1/kernel", "encoder_layer_11/mlp_1/kernel", "head/kernel"]
    assert tp.slot_owner("encoder_layer_1_mlp_1_kernel_momentum", paths) == paths[0]
    assert tp.slot_owner("encoder_layer_11_mlp_1_kernel_velocity", paths) == paths[1]
    assert tp.slot_owner("iteration", paths) is None


def test_qkv_split_by_heads_of_each_of_q_k_and_v():
    hidden, tensor = 8, 2
    weight = np.arange(3 * hidden * hidden, dtype=float).reshape(3 * hidden, hidden)
    key = BLOCK + "self_attention.in_proj_weight"
    second = tp.split_entry(key, weight, tensor, 1)
    rows = [*range(4, 8), *range(12, 16), *range(20, 24)]  # the second half of Q, K and V
    np.testing.assert_array_equal(second, weight[rows])


def test_row_parallel_layers_split_by_input_columns_and_their_bias_stays_whole():
    state = block_state()
    shard = tp.split_state(state, 2, 1)
    np.testing.assert_array_equal(shard[BLOCK + "mlp.3.weight"], state[BLOCK + "mlp.3.weight"][:, 8:])
    np.testing.assert_array_equal(shard[BLOCK + "self_attention.out_proj.weight"],
                                  state[BLOCK + "self_attention.out_proj.weight"][:, 4:])
    np.testing.assert_array_equal(shard[BLOCK + "mlp.0.weight"], state[BLOCK + "mlp.0.weight"][8:])
    for whole in ("mlp.3.bias", "self_attention.out_proj.bias", "ln_1.weight", "ln_2.bias"):
        assert shard[BLOCK + whole] is state[BLOCK + whole]
    assert shard["class_token"] is state["class_token"]


@pytest.mark.parametrize("tensor", [1, 2, 4])
def test_split_then_join_gives_back_the_whole_state(tensor):
    state = block_state(hidden=8, mlp=16)
    shards = [tp.split_state(state, tensor, t) for t in range(tensor)]
    joined = tp.join_states(shards)
    assert list(joined) == list(state)
    for key, value in state.items():
        np.testing.assert_array_equal(joined[key], value)


def test_split_entries_hold_one_over_t_of_the_block():
    state = block_state(hidden=8, mlp=16)
    split = [k for k in state if tp.rule_of(k)]
    whole = sum(state[k].size for k in split)
    assert sum(tp.split_state(state, 2, 0)[k].size for k in split) == whole // 2
    assert 0.5 < tp.split_fraction(state, 2) < 0.6  # the LayerNorms, biases, head kept whole


def test_a_block_that_does_not_split_evenly_says_which_entry():
    with pytest.raises(ValueError, match="mlp.0.weight"):
        tp.split_entry(BLOCK + "mlp.0.weight", np.zeros((6, 4)), 4, 0)


@pytest.mark.parametrize("overrides,message", [
    (["parallel.tensor=2"], "has none"),  # the default CNN
    (["parallel.tensor=5", "model.name=vit_b_16"], "12 attention heads"),
    (["parallel.tensor=2", "model.name=vit_b_16", "horovod.compression=powersgd"], "powersgd"),
    (["parallel.tensor=2", "model.name=vit_b_16", "horovod.op=adasum"], "adasum"),
    (["parallel.tensor=2", "model.name=vit_b_16", "training.elastic=true"], "elastic"),
    (["parallel.tensor=2", "model.name=vit_b_16", "training.balance=dynamic"], "balance=dynamic"),
    (["parallel.tensor=2", "model.name=vit_b_16", "training.zero=3"], "zero=3"),
    (["parallel.tensor=2", "model.name=vit_b_16", "optimizer.name=lars"], "lars: its trust ratio"),
    (["parallel.tensor=2", "model.name=vit_b_16", "optimizer.name=lamb"], "whole norm"),
    (["parallel.tensor=0"], ">= 1"),
])
def test_config_refuses_in_one_line(overrides, message):
    with pytest.raises(UserError, match=message) as caught:
        cfg.load(overrides=overrides)
    assert "\n" not in str(caught.value)


def test_config_takes_a_vit_whose_heads_it_divides():
    assert cfg.load(overrides=["parallel.tensor=4", "model.name=vit_l_16"]).parallel.tensor == 4
    assert cfg.load(overrides=["parallel.tensor=2", "model.name=vit_b_16",  # each split block recomputed
                               "training.activation_checkpointing=true"]).training.activation_checkpointing


@pytest.mark.parametrize("level", [1, 2])
def test_zero_1_and_2_compose_with_the_split_and_save_whole(level):
    from hvdcls import strategy

    config = cfg.load(overrides=["parallel.tensor=2", "model.name=vit_b_16", f"training.zero={level}"])
    assert strategy.strategy_name(config) == "zero"
    assert not strategy.writes_shard_files(config)  # the split's checkpoints are whole
    assert strategy.writes_shard_files(cfg.load(overrides=[f"training.zero={level}"]))


def test_fixed_balancing_plans_per_replica_and_dynamic_is_refused():
    from hvdcls.training import balance

    fixed = ["parallel.tensor=2", "model.name=vit_b_16", "training.balance=fixed", "training.balancing.shares=[3,1]"]
    settings = balance.settings(cfg.load(overrides=fixed), 2, on_gpu=False)  # np=4: 2 replicas
    plan = balance.initial_plan(settings, 2)
    assert plan.batches == (48, 16) and plan.weight(0) == 1.5  # batch_size 32 a replica
    with pytest.raises(UserError, match="2 shares for 4 replicas .one per replica."):
        balance.settings(cfg.load(overrides=fixed), 4, on_gpu=False)


def test_the_norm_counts_a_slice_once_and_a_whole_entry_once_over_the_group():
    state = block_state(hidden=8, mlp=16)
    for tensor in (2, 4):
        counted = sum(tp.norm_share(k, tensor) * (v.size // (tensor if tp.rule_of(k) else 1)) * tensor
                      for k, v in state.items())
        assert counted == pytest.approx(sum(v.size for v in state.values()))
    assert tp.norm_share(BLOCK + "mlp.0.weight", 2) == 1.0 and tp.norm_share(BLOCK + "ln_1.weight", 2) == 0.5


def test_the_range_test_deals_its_batches_and_scales_its_rate_by_replica():
    from types import SimpleNamespace

    from hvdcls.training import lr_find_command, lr_sweep

    config = cfg.load(overrides=["parallel.tensor=2", "model.name=vit_b_16", "optimizer.lr=auto"])
    assert [lr_sweep.replicas(config, SimpleNamespace(size=4, rank=r)) for r in range(4)] == [(2, 0), (2, 0),
                                                                                              (2, 1), (2, 1)]
    assert lr_find_command.global_batch(config, 4) == 2 * config.training.batch_size
