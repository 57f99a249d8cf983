/* Every flag of the gpt program (its usage text, `gpt --help`) is
 * documented in docs/examples.md's section "The GPT example", as
 * tests/docs/check_docs.py does for the meshpg program's commands. */
#include <criterion/criterion.h>

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../support/run_util.h"

/* docs/examples.md from the source root (the parent of MESHPG_TEST_DATA),
 * cut to the GPT example's section. */
static char *gpt_section(void) {
  char path[4096];
  snprintf(path, sizeof path, "%s/../docs/examples.md", env_program("MESHPG_TEST_DATA"));
  FILE *f = fopen(path, "rb");
  cr_assert_not_null(f, "cannot open %s", path);
  static char text[1 << 18];
  size_t n = fread(text, 1, sizeof text - 1, f);
  fclose(f);
  text[n] = '\0';
  char *from = strstr(text, "\n## The GPT example");
  cr_assert_not_null(from, "%s: no section \"## The GPT example\"", path);
  char *to = strstr(from + 1, "\n## ");
  if (to) *to = '\0';
  return from;
}

/* Is `flag` in s as a whole word (not a prefix of a longer flag)? */
static int has_flag(const char *s, const char *flag) {
  const size_t n = strlen(flag);
  for (const char *p = strstr(s, flag); p; p = strstr(p + 1, flag)) {
    const char after = p[n], before = p > s ? p[-1] : ' ';
    if (!(isalnum((unsigned char)after) || after == '-') &&
        !(isalnum((unsigned char)before) || before == '-'))
      return 1;
  }
  return 0;
}

Test(gpt_flags, every_flag_documented) {
  char cmd[4096];
  snprintf(cmd, sizeof cmd, "'%s' --help", env_program("MESHPG_GPT_EXE"));
  cr_assert_eq(run(cmd, NULL), 0, "%s:\n%s", cmd, out);
  const char *usage = out;
  const char *doc = gpt_section();
  int flags = 0;
  char seen[4096] = " ";
  for (const char *p = usage; (p = strstr(p, "--")) != NULL;) {
    char flag[64];
    size_t k = 2;
    while (k < sizeof flag - 1 && (islower((unsigned char)p[k]) || isdigit((unsigned char)p[k]) ||
                                   (p[k] == '-' && islower((unsigned char)p[k + 1]))))
      k++;
    memcpy(flag, p, k);
    flag[k] = '\0';
    p += k;
    if (k == 2 || !strcmp(flag, "--help")) continue;
    char key[80];
    snprintf(key, sizeof key, " %s ", flag);
    if (strstr(seen, key)) continue; /* named twice in the usage */
    snprintf(seen + strlen(seen), sizeof seen - strlen(seen), "%s ", flag);
    flags++;
    cr_expect(has_flag(doc, flag),
              "gpt flag %s (in its --help) is not documented in docs/examples.md, section "
              "\"The GPT example\"", flag);
  }
  cr_expect_geq(flags, 30, "only %d flags in gpt --help:\n%s", flags, usage);
  cr_log_info("%d flags of gpt --help checked", flags);
}
