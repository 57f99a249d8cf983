/* The group level's side of sync's shared-memory segments
 * (groups_internal.h's mpg__shm_create): the group hands groups/shm/ its
 * setup collectives as callbacks (transport.h, coll.c's
 * mpg__group_transport_setup), so that shm/ never calls up into the group
 * layer to come up.  The segment then lives in the group's transport list
 * (shm/setup.c), where the context's abort and teardown reach it. */
#include "core.h"
#include "shm/channel.h"

mpg_status mpg__shm_create(mpg_group *group, size_t bytes, mpg_dtype dtype, int depth,
                           int scatter, mpg__shm **out, void **data) {
  mpg__transport_setup setup = mpg__group_transport_setup(group);
  return mpg__shm_segment_create(group, &setup, bytes, dtype, depth, scatter, out, data);
}
