"""Spread many small calls over the pool; results come back in input order."""

import math

import skyward as sky


@sky.compute
def is_prime(n: int) -> bool:
    return n > 1 and all(n % d for d in range(2, math.isqrt(n) + 1))


if __name__ == "__main__":
    with sky.ComputePool(nodes=4, concurrency=2) as pool:
        flags = pool.map(is_prime, range(10_000))
        print(f"{sum(flags)} primes below 10,000")
        # the same with futures, for when you want results as they finish
        futures = [is_prime(n) > pool for n in (2**31 - 1, 2**31 + 1)]
        print([f.result() for f in futures])
        # several different calls in parallel, one tuple back
        print((is_prime(97) & is_prime(98) & is_prime(99)) >> pool)
        print(pool.statistics())
