/* Best-fit sub-allocator over one fixed address range (the recorder's device arena and its pinned host
 * region). Pure bookkeeping: it never touches the memory it hands out, so it is unit-tested on the CPU.
 *
 * Free blocks and live allocations are kept in two address-sorted arrays; a free merges with its
 * neighbours, so the free list never holds two adjacent blocks. */
#ifndef MNEME_RECORDER_ARENA_H
#define MNEME_RECORDER_ARENA_H

#include <stddef.h>
#include <stdint.h>

typedef struct mn_span { uint64_t addr, size; } mn_span;

/* A live allocation: `size` as requested (what a snapshot stores), `reserved` as rounded up. */
typedef struct mn_alloc { uint64_t addr, size, reserved; } mn_alloc;

typedef struct mn_arena {
  uint64_t base, size, align;
  mn_span *free;
  size_t nfree, capfree;
  mn_alloc *live;
  size_t nlive, caplive;
  uint64_t in_use;   /* reserved bytes of live allocations */
  uint64_t top;      /* highest end (address) ever handed out */
} mn_arena;

/* `align` must be a power of two; base is used as given. Returns 0, or -1 on bad arguments/no memory. */
int mn_arena_init(mn_arena *a, uint64_t base, uint64_t size, uint64_t align);
void mn_arena_destroy(mn_arena *a);
/* Keeps the first `bytes` (rounded up to the alignment) of a fresh arena out of every allocation: a
 * guard below the first allocation, still inside the range (so mapped wherever the range is). 0, or -1
 * when the arena already served an allocation or the guard would not leave room for one. */
int mn_arena_keep_front(mn_arena *a, uint64_t bytes);
/* Address of a new allocation of `size` bytes (> 0), or 0 when no free block is large enough. */
uint64_t mn_arena_alloc(mn_arena *a, uint64_t size);
/* Frees the allocation that starts at `addr`; 0, or -1 when `addr` starts no live allocation.
 * The freed allocation is copied to *out when out != NULL. */
int mn_arena_free(mn_arena *a, uint64_t addr, mn_alloc *out);
/* The live allocation containing `addr`, or NULL. */
const mn_alloc *mn_arena_find(const mn_arena *a, uint64_t addr);
/* 1 when addr lies inside the arena's range (allocated or not). */
int mn_arena_contains(const mn_arena *a, uint64_t addr);
/* Size of the largest free block (for "arena full" messages). */
uint64_t mn_arena_largest_free(const mn_arena *a);

uint64_t mn_round_up(uint64_t x, uint64_t align);
/* Row pitch for a pitched allocation of `width` bytes: width rounded up to the runtime's pitch alignment. */
uint64_t mn_pitch(uint64_t width, uint64_t pitch_align);

#endif
