/* meshpg's own rendezvous (groups/rendezvous.c): rank 0 hands a few bytes
 * (the NCCL unique id) to every other rank over TCP, at MASTER_ADDR:port,
 * the way torch's TCPStore carries it under torchrun.  It exists so that
 * the library never writes the environment: before it, the NCCL backend
 * set NCCL_COMM_ID for NCCL's own rendezvous.
 *
 * The exchange, one connection per rank other than 0, all integers big
 * endian:
 *   hello (rank r -> rank 0), 20 bytes: "MPGRDV01", r (u32), size (u32),
 *     n, the payload's length (u32);
 *   reply (rank 0 -> r), 8 + n bytes: verdict (u32: 0 served, 1 the worlds
 *     differ in size, 2 r is out of range, 3 the payloads differ in
 *     length), rank 0's world size (u32), then the n payload bytes (zeros
 *     unless served).
 * Rank 0 listens on the wildcard address of MASTER_ADDR's family (as
 * torch's TCPStore does), serves each rank as it arrives (a rank served
 * twice, after a retry, gets the same bytes), and stops listening once
 * every rank has been served.  Ranks other than 0 retry the connection
 * until rank 0 listens or the deadline passes. */
#ifndef MPG_GROUPS_RENDEZVOUS_H
#define MPG_GROUPS_RENDEZVOUS_H

#include <stddef.h>

#include "internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Collective over the `size` ranks of one world.  Rank 0 passes the
 * payload in buf[0..n); the others receive it there.  addr: MASTER_ADDR
 * (a name, an IPv4 or an IPv6 address); port 1..65535; deadline on
 * mpg__now()'s clock.  `what` starts every message ("nccl bootstrap").
 * Returns MPG_OK; MPG_ERR_TIMEOUT (rank 0: naming the ranks that never
 * came; others: naming the address and the last connection error);
 * MPG_ERR_ENV (an address that does not resolve, a port rank 0 cannot
 * bind, or a rank 0 whose world differs from this rank's);
 * MPG_ERR_INVALID; MPG_ERR_NOMEM.  Never raises SIGPIPE. */
mpg_status mpg__rendezvous_bcast(const char *what, const char *addr, int port, int rank,
                                 int size, void *buf, size_t n, double deadline);

#ifdef __cplusplus
}
#endif

#endif
