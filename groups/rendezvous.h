/* meshpg's own rendezvous (groups/rendezvous.c): rank 0 hands a few bytes
 * (the NCCL unique id) to every other rank over TCP, at MASTER_ADDR:port,
 * the way torch's TCPStore carries it under torchrun.  It exists so that
 * the library never writes the environment: before it, the NCCL backend
 * set NCCL_COMM_ID for NCCL's own rendezvous.
 *
 * Only the ranks of one job take part: both sides prove that they hold the
 * job key (mpg__rdv_key, from MESHPG_JOB_KEY or the launcher's job id; see
 * docs/launchers.md, "The rendezvous and its job key") with HMAC-SHA256
 * over fresh nonces; the key never crosses the wire.  The exchange, one
 * connection per rank other than 0, all integers big endian, MAC =
 * HMAC-SHA256(key, ...):
 *   challenge (rank 0 -> r), 24 bytes: "MPGRDV02", Ns (16 random bytes);
 *   hello (r -> rank 0), 68 bytes: "MPGRDV02", r (u32), size (u32), n, the
 *     payload's length (u32), Nc (16 random bytes),
 *     MAC("meshpg-rdv-c" Ns Nc r size n);
 *   reply (rank 0 -> r), 44 + len bytes: verdict (u32: 0 served, 1 the
 *     worlds differ in size, 2 r is out of range, 3 the payloads differ in
 *     length, 4 r was already served to another peer), rank 0's world size
 *     (u32), len (u32), MAC("meshpg-rdv-s" Nc Ns r size n verdict size0
 *     len body), then the body: the n payload bytes when served, the
 *     address of the peer served first for verdict 4, else nothing.
 * A hello whose MAC does not verify (a stranger, another job's rank) is
 * dropped without a reply; a reply whose MAC does not verify (a stranger
 * listening on the port) is never used.  Every length is bounded.
 * Rank 0 listens on the wildcard address of MASTER_ADDR's family (as
 * torch's TCPStore does) and serves its connections concurrently (poll):
 * each gets RDV_HELLO_S to say hello, at most RDV_PENDING wait at once
 * (the oldest is dropped for a new one), so silent connections cannot
 * hold up the real ranks.  Each rank is served once; rank 0 stops
 * listening once every rank has been served.  Ranks other than 0 retry
 * until rank 0 answers them or the deadline passes. */
#ifndef MPG_GROUPS_RENDEZVOUS_H
#define MPG_GROUPS_RENDEZVOUS_H

#include <stddef.h>

#include "internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The job key: 32 bytes, and where it came from ("MESHPG_JOB_KEY",
 * "TORCHELASTIC_RUN_ID", ...; "no job id" for the fallback). */
typedef struct {
  unsigned char bytes[32];
  char source[48];
} mpg__rdv_key;

/* The key of this process's job, from the environment, first match wins:
 * MESHPG_JOB_KEY (a secret, at least 16 bytes), TORCHELASTIC_RUN_ID
 * (unless "none", torchrun's default), SLURM_JOB_ID (with SLURM_STEP_ID),
 * PMIX_NAMESPACE, OMPI_MCA_ess_base_jobid; none: a key every rank without
 * a job id shares (logged at info level).  Each is hashed with
 * HMAC-SHA256 under a label naming the variable.  MPG_OK; MPG_ERR_ENV (a
 * MESHPG_JOB_KEY shorter than 16 bytes); MPG_ERR_BACKEND (libcrypto). */
mpg_status mpg__rendezvous_key_from_env(mpg__rdv_key *out);

/* Collective over the `size` ranks of one world.  Rank 0 passes the
 * payload in buf[0..n); the others receive it there.  addr: MASTER_ADDR
 * (a name, an IPv4 or an IPv6 address); port 1..65535; deadline on
 * mpg__now()'s clock.  `what` starts every message ("nccl bootstrap").
 * Returns MPG_OK; MPG_ERR_TIMEOUT (rank 0: naming the ranks that never
 * came; others: naming the address and why the last try failed);
 * MPG_ERR_ENV (an address that does not resolve, a port rank 0 cannot
 * bind, a rank 0 whose world differs from this rank's, or a rank claimed
 * by two peers: both addresses named, on rank 0 and on the second);
 * MPG_ERR_INVALID; MPG_ERR_NOMEM; MPG_ERR_BACKEND.  Never raises SIGPIPE.
 * The _keyed variant takes the key; the other reads it from the
 * environment (mpg__rendezvous_key_from_env). */
mpg_status mpg__rendezvous_bcast_keyed(const char *what, const mpg__rdv_key *key,
                                       const char *addr, int port, int rank, int size,
                                       void *buf, size_t n, double deadline);
mpg_status mpg__rendezvous_bcast(const char *what, const char *addr, int port, int rank,
                                 int size, void *buf, size_t n, double deadline);

#ifdef __cplusplus
}
#endif

#endif
