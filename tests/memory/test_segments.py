"""The caching-allocator model behind the ZeRO-1/2 replay (memory/segments.py)."""

from zeropilot.memory.segments import MIB, Allocator


def test_best_fit_split_and_merge_and_reserved_never_shrinks():
    pool = Allocator()
    a = pool.alloc(100 * MIB)
    b = pool.alloc(60 * MIB)
    assert pool.reserved == 160 * MIB  # each request its own segment, rounded to 2 MiB
    pool.free(a)
    pool.free(b)
    c = pool.alloc(50 * MIB)  # best fit: the 60 MiB block, split, not the 100 MiB one
    d = pool.alloc(90 * MIB)
    assert pool.reserved == 160 * MIB
    pool.free(c)
    pool.free(d)
    pool.alloc(110 * MIB)  # free 100 + 60 in two segments: blocks never span segments
    assert pool.reserved == 270 * MIB
    pool.free(pool.alloc(5 * MIB))  # under 10 MiB: a 20 MiB segment unless a free block fits
    assert pool.reserved == 270 * MIB
    assert pool.alloc(MIB // 2) is None  # the small pool is left out


def test_a_split_block_merges_back_with_its_free_neighbours():
    pool = Allocator()
    whole = pool.alloc(64 * MIB)
    pool.free(whole)
    parts = [pool.alloc(16 * MIB) for _ in range(4)]
    assert pool.reserved == 64 * MIB
    for p in (parts[1], parts[3], parts[2], parts[0]):
        pool.free(p)
    pool.alloc(64 * MIB)  # the four pieces merged back into one block
    assert pool.reserved == 64 * MIB
