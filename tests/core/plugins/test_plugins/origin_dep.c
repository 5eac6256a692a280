/* libbhtestdep.so: a library that the origin_* test plugins link and find beside them through
 * $ORIGIN in their RUNPATH or RPATH, as a connector that bundles its own libraries does. A build
 * with BHTESTDEP_ANSWER=41 is a wrong copy (the plugins' init() wants 42). */
#ifndef BHTESTDEP_ANSWER
#define BHTESTDEP_ANSWER 42
#endif
__attribute__((visibility("default"))) int backhaul_test_dep_answer(void) {
  return BHTESTDEP_ANSWER;
}
