/* libbhtestmid.so: needs libbhtestdep.so and has no RUNPATH or RPATH of its own. It relies on the
 * plugin's, as glibc allows: an RPATH is searched for the dependencies of dependencies, and a
 * library mapped earlier in the breadth-first order is taken by its SONAME. */
int backhaul_test_dep_answer(void);
__attribute__((visibility("default"))) int backhaul_test_mid_answer(void) {
  return backhaul_test_dep_answer();
}
