/* A guard in front of hwloc's XML loader: hwloc 2.9 crashes (instead of
 * failing) on some malformed topology files, so mpg_topo_load_xml scans the
 * text for those first.  Found by tests/fuzz (fuzz_topo_xml). */
#include <string.h>

#include "topo_internal.h"

/* The value of attribute `name` in the n chars of an XML tag (its quote
 * stripped: *len chars at the result), or NULL when the tag lacks it. */
static const char *xml_attr(const char *tag, size_t n, const char *name, size_t *len) {
  size_t nl = strlen(name);
  for (size_t i = 1; i + nl < n; i++) {
    if (!strchr(" \t\r\n", tag[i - 1]) || strncmp(tag + i, name, nl) != 0) continue;
    size_t j = i + nl;
    while (j < n && tag[j] && strchr(" \t\r\n", tag[j])) j++;
    if (j >= n || tag[j] != '=') continue;
    for (j++; j < n && strchr(" \t\r\n", tag[j]); j++) {}
    const char *q = j < n ? strchr("\"'", tag[j]) : NULL;
    if (!q || !*q) {
      *len = 0;
      return tag + j;
    }
    const char *v = tag + j + 1, *e = memchr(v, tag[j], n - j - 1);
    *len = e ? (size_t)(e - v) : n - j - 1;
    return v;
  }
  return NULL;
}

/* A bitmap as hwloc writes it: "0x0000000f", "0xffffffff,0x00000003", with
 * an optional leading "0xf...f," for an infinite set. */
static int xml_bitmap_ok(const char *v, size_t n) {
  if (n >= 8 && strncmp(v, "0xf...f", 7) == 0) {
    if (n == 7) return 1;
    if (v[7] != ',') return 0;
    v += 8, n -= 8;
  }
  for (;;) {
    if (n < 3 || v[0] != '0' || v[1] != 'x') return 0;
    size_t k = 2;
    while (k < n && strchr("0123456789abcdefABCDEF", v[k]) && v[k]) k++;
    if (k == 2) return 0;
    if (k == n) return 1;
    if (v[k] != ',') return 0;
    v += k + 1, n -= k + 1;
  }
}

/* hwloc 2.9 dereferences a NULL bitmap in hwloc_topology_load (a crash, not
 * an error) when an XML object has a cpuset but no complete_cpuset, or a
 * nodeset but no complete_nodeset, or a set that is not a bitmap ("0x3k");
 * hwloc itself always writes both, well formed.  The line of the first such
 * <object> of the text, 0 if none; *why says which rule it breaks. */
int mpg__topo_xml_bad_sets(const char *text, size_t size, const char **why) {
  static const char *const sets[] = {"cpuset",  "complete_cpuset",  "allowed_cpuset",
                                     "nodeset", "complete_nodeset", "allowed_nodeset"};
  int line = 1;
  for (const char *p = text, *end = text + size; p < end; p++) {
    if (*p == '\n') line++;
    if (*p != '<' || strncmp(p, "<object", 7) != 0) continue;
    const char *gt = memchr(p, '>', (size_t)(end - p));
    size_t n = gt ? (size_t)(gt - p) : (size_t)(end - p), len;
    if (!xml_attr(p, n, "cpuset", &len) != !xml_attr(p, n, "complete_cpuset", &len) ||
        !xml_attr(p, n, "nodeset", &len) != !xml_attr(p, n, "complete_nodeset", &len)) {
      *why = "an object has a cpuset without a complete_cpuset or a nodeset without a "
             "complete_nodeset (or the other way round)";
      return line;
    }
    for (size_t k = 0; k < sizeof sets / sizeof sets[0]; k++) {
      const char *v = xml_attr(p, n, sets[k], &len);
      if (v && !xml_bitmap_ok(v, len)) {
        *why = "an object's cpuset or nodeset is not a bitmap like \"0x0000000f\"";
        return line;
      }
    }
  }
  return 0;
}
