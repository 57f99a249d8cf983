/* The body of a split in the thread backend (layer: above group.c, below
 * coll.c).  A split is a collective over the parent group (kind
 * MPG_THREAD_KIND_SPLIT, matched like any other in coll.c); its last
 * arrival calls mpg__thread_perform_split(), which sorts the members by
 * (colour, key, position) and makes one child group per colour.  The
 * member's side, posting the split and waiting for its own child, is
 * t_split() in world.c. */
#include <stdio.h>
#include <stdlib.h>

#include "thread_internal.h"

static void *xmalloc(size_t n) { return malloc(n ? n : 1); }

typedef struct skey {
  int color, key, pos;
} skey;

static int skey_cmp(const void *a, const void *b) {
  const skey *x = a, *y = b;
  if (x->color != y->color) return x->color < y->color ? -1 : 1;
  if (x->key != y->key) return x->key < y->key ? -1 : 1;
  return (x->pos > y->pos) - (x->pos < y->pos);
}

mpg_status mpg__thread_perform_split(tgroup *g, top *op) {
  int n = g->size, m = 0;
  skey *k = xmalloc(sizeof(skey) * (size_t)n);
  if (!k) return MPG_ERR_NOMEM;
  for (int p = 0; p < n; p++) {
    mpg__req *r = op->reqs[p];
    r->child = NULL;
    r->child_pos = -1;
    if (r->color >= 0) k[m++] = (skey){r->color, r->key, p};
  }
  qsort(k, (size_t)m, sizeof *k, skey_cmp);
  unsigned id = g->nsplits++;
  for (int i = 0; i < m;) {
    int j = i;
    while (j < m && k[j].color == k[i].color) j++;
    char name[MPG_THREAD_NAME_LEN];
    if (snprintf(name, sizeof name, "%s/s%uc%d", g->name, id, k[i].color) >=
        (int)sizeof name)
      name[sizeof name - 1] = '\0'; /* a long chain of splits: truncated */
    tgroup *child = mpg__thread_group_new(j - i, name);
    if (!child) {
      /* Undo the children made so far: nobody has seen them. */
      for (int q = 0; q < i; q++) {
        mpg__req *r = op->reqs[k[q].pos];
        if (r->child && r->child_pos == 0) mpg__thread_group_free(r->child);
      }
      for (int q = 0; q < i; q++) op->reqs[k[q].pos]->child = NULL;
      free(k);
      return MPG_ERR_NOMEM;
    }
    child->refs = j - i;
    for (int q = i; q < j; q++) {
      child->ranks[q - i] = g->ranks[k[q].pos];
      op->reqs[k[q].pos]->child = child;
      op->reqs[k[q].pos]->child_pos = q - i;
    }
    mpg__log(2, "thread: split #%u of %s: colour %d -> group %s of %d ranks", id,
             g->name, k[i].color, child->name, j - i);
    i = j;
  }
  free(k);
  return MPG_OK;
}
