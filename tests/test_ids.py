"""Response and item ids: OpenAI's shape, the creation time first, the rest random and never handed out twice,
in one process or in forked workers (the random bytes come from a pool each process reads for itself)."""

import os
import time

from gateway.translate.response_object import id_created_at, new_id, random_hex


def test_ids_are_shaped_as_openai_s_and_carry_their_creation_time():
    before = time.time()
    made = new_id("resp")
    prefix, _, digits = made.partition("_")
    assert prefix == "resp" and len(digits) == 48 and int(digits, 16) >= 0
    assert before - 0.002 <= id_created_at(made) <= time.time() + 0.002


def test_random_parts_never_repeat_across_many_pools():
    # Far more bytes than one pool holds, in sizes that do not divide it: every draw is fresh.
    draws = [random_hex(count) for _ in range(3000) for count in (16, 18, 7)]
    assert len(set(draws)) == len(draws)
    assert {len(d) for d in draws} == {32, 36, 14}


def test_a_forked_worker_does_not_hand_out_its_parent_s_bytes():
    random_hex(18)  # the parent's pool is read: a child must not continue it
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        os.write(write, "".join(random_hex(18) for _ in range(4)).encode())
        os._exit(0)
    os.close(write)
    child = os.read(read, 1024).decode()
    os.close(read)
    os.waitpid(pid, 0)
    parent = "".join(random_hex(18) for _ in range(4))
    assert len(child) == len(parent) == 144 and child != parent
