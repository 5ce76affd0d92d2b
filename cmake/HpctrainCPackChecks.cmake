# Read by cpack before it packs (CPACK_PROJECT_CONFIG_FILE, cmake/HpctrainInstall.cmake).
# A package is installed on other machines: one built with -march=native dies there with SIGILL
# at the first instruction their CPU lacks.
if(CPACK_HPCTRAIN_NATIVE)
  message(WARNING "hpctrain: these packages are built for this machine's CPU (HPCTRAIN_NATIVE=ON, -march=native) "
                  "and may die with SIGILL on another; configure with -DHPCTRAIN_NATIVE=OFF for packages to install elsewhere")
endif()
