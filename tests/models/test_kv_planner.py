"""The KV planner's cost rule, with token counts written out by hand (the engine tests check
that every source samples and scores as a plain prefill does)."""

from rlanything.models.engines.kv_planner import kv_source, padded_tokens, tree_tokens
from rlanything.models.training.packing import pack


def test_padded_tokens_count_rows_times_the_longest_part_left():
    seqs = [[1, 2, 3, 4], [1, 2, 3]]
    assert padded_tokens(seqs, [0, 0]) == 2 * 4
    assert padded_tokens(seqs, [3, 0]) == 2 * 3  # the second row is the longest part left
    assert padded_tokens(seqs, [3, 2]) == 2 * 1
    assert padded_tokens(seqs, [0, 0], start=2) == 2 * 2  # a SharedPrefix holds the first two
    assert padded_tokens(seqs, [3, 0], start=2) == 2 * 1


def test_tree_tokens_count_trees_times_the_largest_tree():
    trees, _ = pack([[1, 2, 3, 4], [1, 2, 3, 5]])
    assert len(trees) == 1 and tree_tokens(trees) == 5  # 1, 2, 3, then 4 and 5
    assert tree_tokens([trees[0], trees[0]]) == 10


def test_the_source_feeding_the_fewest_tokens_is_picked():
    seqs = [[1, 2, 3, 4], [1, 2, 3, 5]]
    trees, _ = pack(seqs)  # 5 nodes
    assert kv_source(seqs, [3, 3], trees) == "reuse"  # 2 × 1 < 5
    assert kv_source(seqs, [3, 0], trees) == "tree"  # 2 × 4 ≥ 5, and the plain 2 × 4 > 5
    assert kv_source(seqs, [0, 0], trees) == "tree"
    distinct = [[1, 2, 3], [4, 5, 6]]
    trees, _ = pack(distinct)  # nothing repeats: 2 trees of 3 nodes
    assert kv_source(distinct, [0, 0], trees) == "plain"  # a tie: the tree forward saves nothing
    assert kv_source(distinct, [2, 2], trees) == "reuse"  # 2 × 1 < 6
    assert kv_source(distinct, [2, 0], trees) == "plain"  # 2 × 3: the second row feeds all of its tokens
    assert kv_source(distinct, [2, 2], trees, start=2) == "plain"  # the reused tokens lie in the prefix


def test_a_tie_between_reuse_and_the_tree_goes_to_the_tree():
    seqs = [[1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 3, 6]]
    trees, _ = pack(seqs)  # one tree of 6 nodes; a plain forward feeds 3 × 4
    assert kv_source(seqs, [2, 2, 2], trees) == "tree"  # 3 × 2 = 6: no fewer than the tree's
    assert kv_source(seqs, [3, 3, 2], trees) == "tree"
    assert kv_source(seqs, [3, 3, 3], trees) == "reuse"  # 3 × 1
