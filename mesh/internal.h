/* Internal helpers shared by every module (names start mpg__). */
#ifndef MPG_INTERNAL_H
#define MPG_INTERNAL_H

#include "meshpg.h"

#include <stdarg.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define MPG__PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define MPG__PRINTF(a, b)
#endif

/* Record the thread's last error message and return `status`. */
mpg_status mpg__fail(mpg_status status, const char *fmt, ...) MPG__PRINTF(2, 3);

/* Record an error positioned in a spec source: "file:line:col: " prefix
 * when pos->line > 0 (file "" gives "<string>"). */
mpg_status mpg__fail_at(mpg_status status, const char *source,
                        mpg_srcpos pos, const char *fmt, ...)
    MPG__PRINTF(4, 5);

/* Clear the thread's last error (successful public calls need not). */
void mpg__clear_error(void);

/* Logging, only when MESHPG_LOG=info|debug.  level 1 = info, 2 = debug. */
int mpg__log_level(void);
void mpg__log(int level, const char *fmt, ...) MPG__PRINTF(2, 3);

/* Name rules shared by the spec and the mesh. */
int mpg__name_valid(const char *name);

/* Smallest edit distance name among candidates, or NULL if none is close. */
const char *mpg__closest(const char *word, const char *const *cands, int n);

#ifdef __cplusplus
}
#endif
#endif
