/* Private to test_cpp (test_cpp.cpp, test_cpp_threads.cpp,
 * test_cpp_trainer.cpp): REQUIRE for ranks (it throws), expect_error, the
 * environment and shell helpers (defined in test_cpp.cpp), the seed mesh. */
#ifndef MESHPG_TEST_CPP_HPP
#define MESHPG_TEST_CPP_HPP

#include <criterion/criterion.h>

#include <meshpg.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#define REQUIRE(cond)                                                         \
  do {                                                                        \
    if (!(cond))                                                              \
      throw std::runtime_error(std::string(__FILE__ ":") +                    \
                               std::to_string(__LINE__) + ": failed: " #cond); \
  } while (0)

/* Run f; it must throw meshpg::Error with status `want`.  Returns it. */
template <class F>
inline meshpg::Error expect_error(mpg_status want, F&& f) {
  try {
    f();
  } catch (const meshpg::Error& e) {
    if (e.status() != want)
      throw std::runtime_error(std::string("expected ") + mpg_status_name(want) +
                               ", got " + e.what());
    return e;
  }
  throw std::runtime_error(std::string("expected ") + mpg_status_name(want) +
                           ", nothing was thrown");
}

std::string env_or_fail(const char* var);
std::string data_dir();
int run(const std::string& cmd, std::string* out);
size_t count_of(const std::string& text, const std::string& what);
bool has(const std::string& text, const std::string& what);
meshpg::Spec seed_spec();

#define EXPECT_RUN_OK(run)                                                      \
  cr_assert((run).ok(), "run_threads: %s (rank %d): %s", mpg_status_name((run).status), \
            (run).failed_rank, (run).message.c_str())

#endif
