/* cli_alloc.h - `mmguard alloc-replay TRACE`: replay a real CUDA caching
 * allocator trace through the allocator model (docs/allocator.md). */
#ifndef MM_CLI_ALLOC_H
#define MM_CLI_ALLOC_H

/* argv[0] == "alloc-replay".  Exit status: 0 ok, 2 bad input or usage. */
int mm_cli_alloc_replay(int argc, char **argv);

#endif
