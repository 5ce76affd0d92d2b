# What `cmake --install` puts where (GNU layout under CMAKE_INSTALL_PREFIX), and the Debian package
# cpack makes from it (`cpack -G DEB` in the build directory). tests/package/package_test.sh
# unpacks that package into a fresh root and runs the programs, the man page and a CMake project
# that links the library from there.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# The programs. hpcdata finds hpcdata-pack on PATH; the Slurm scripts find job.sh and hpcdata
# below HPCTRAIN_HOME (share/hpctrain: the tree's layout) and the programs on PATH.
install(TARGETS hpctrain hpcrun hpcdata-pack RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(PROGRAMS datasets/hpcdata launch/hpctrain-plot DESTINATION ${CMAKE_INSTALL_BINDIR})
install(PROGRAMS slurm/train.sbatch slurm/sweep.sbatch slurm/chain.sh slurm/local-cluster.sh slurm/job.sh slurm/epilog.sh
        DESTINATION ${CMAKE_INSTALL_DATADIR}/hpctrain/slurm)
install(PROGRAMS datasets/hpcdata DESTINATION ${CMAKE_INSTALL_DATADIR}/hpctrain/datasets)
install(FILES README.md docs/aws.md docs/performance.md DESTINATION ${CMAKE_INSTALL_DOCDIR})
foreach(room slurm launch datasets)  # each room's README.md, by the room's name
  install(FILES ${room}/README.md DESTINATION ${CMAKE_INSTALL_DOCDIR} RENAME ${room}.md)
endforeach()

# Man pages, made from each program's --help by help2man at build time.
find_program(HELP2MAN help2man)
if(HELP2MAN)
  set(pages)
  # hpctrain's subcommands, every option of each (docs/man/commands.sh), for its page.
  set(commands_h2m ${CMAKE_BINARY_DIR}/man/hpctrain-commands.h2m)
  add_custom_command(OUTPUT ${commands_h2m}
    COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_BINARY_DIR}/man
    COMMAND bash ${PROJECT_SOURCE_DIR}/docs/man/commands.sh $<TARGET_FILE:hpctrain> ${commands_h2m}
    DEPENDS hpctrain ${PROJECT_SOURCE_DIR}/docs/man/commands.sh VERBATIM)
  set(man_dir ${PROJECT_SOURCE_DIR}/docs/man)
  # name, command, one-line description, more help2man arguments (^-separated): the version is
  # the project's (not --version's text, which names the build machine's GPUs), and the pages of
  # hpctrain and hpcrun include EXIT STATUS, SIGNALS, ENVIRONMENT, FILES, EXAMPLES (docs/man).
  foreach(entry "hpctrain|$<TARGET_FILE:hpctrain>|data-parallel training of image classifiers on CPUs and GPUs|--include=${man_dir}/hpctrain.h2m^--include=${commands_h2m}"
                "hpcrun|$<TARGET_FILE:hpcrun>|launch and supervise an MPI training job across hosts|--include=${man_dir}/hpcrun.h2m"
                "hpcdata|${PROJECT_SOURCE_DIR}/datasets/hpcdata|prepare, pack and stage datasets for hpctrain|"
                "hpcdata-pack|$<TARGET_FILE:hpcdata-pack>|pack an image folder into shards for hpctrain|"
                "hpctrain-plot|${PROJECT_SOURCE_DIR}/launch/hpctrain-plot|charts of hpctrain metrics files|")
    string(REPLACE "|" ";" fields "${entry}")
    list(GET fields 0 name)
    list(GET fields 1 program)
    list(GET fields 2 what)
    list(GET fields 3 extra)
    string(REPLACE "^" ";" extra "${extra}")
    set(depends ${program})
    foreach(arg IN LISTS extra)
      if(arg MATCHES "^--include=(.*)$")
        list(APPEND depends ${CMAKE_MATCH_1})
      endif()
    endforeach()
    set(page ${CMAKE_BINARY_DIR}/man/${name}.1)
    # OMPI_ALLOW_RUN_AS_ROOT: --help starts MPI (a world of one), which Open MPI refuses to root.
    # Compressed, as Debian ships man pages (gzip -n: the same bytes on every build).
    add_custom_command(OUTPUT ${page}.gz
      COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_BINARY_DIR}/man
      COMMAND ${CMAKE_COMMAND} -E env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
              ${HELP2MAN} --no-info --no-discard-stderr --name=${what} --version-string=${PROJECT_VERSION} ${extra}
              --output=${page} ${program}
      COMMAND gzip -9nf ${page}
      DEPENDS ${depends} VERBATIM)
    list(APPEND pages ${page}.gz)
  endforeach()
  add_custom_target(man_pages ALL DEPENDS ${pages})
  add_dependencies(man_pages hpctrain hpcrun hpcdata-pack)  # built before help2man runs them
  install(FILES ${pages} DESTINATION ${CMAKE_INSTALL_MANDIR}/man1)
else()
  message(WARNING "help2man not found: no man pages will be made or installed (apt-get install help2man)")
endif()

# The library, its headers (include/hpctrain/<room>/*.hpp, included as "core/duration.hpp") and
# a CMake package: find_package(hpctrain) gives hpctrain::hpctrain_lib.
set(HPCTRAIN_EXPORTED hpctrain_lib hpctrain_usage hpctrain_dnnl)
if(HPCTRAIN_GPU_TRAINING)
  list(APPEND HPCTRAIN_EXPORTED hpctrain_kernels)
endif()
install(TARGETS ${HPCTRAIN_EXPORTED} EXPORT hpctrainTargets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(DIRECTORY src/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/hpctrain FILES_MATCHING PATTERN "*.hpp")
install(FILES kernels/kernels.hpp DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/hpctrain/kernels)
set(HPCTRAIN_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/hpctrain)
install(EXPORT hpctrainTargets NAMESPACE hpctrain:: DESTINATION ${HPCTRAIN_CMAKE_DIR})
configure_package_config_file(cmake/hpctrainConfig.cmake.in ${CMAKE_BINARY_DIR}/hpctrainConfig.cmake
                              INSTALL_DESTINATION ${HPCTRAIN_CMAKE_DIR})
write_basic_package_version_file(${CMAKE_BINARY_DIR}/hpctrainConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/hpctrainConfig.cmake ${CMAKE_BINARY_DIR}/hpctrainConfigVersion.cmake
        DESTINATION ${HPCTRAIN_CMAKE_DIR})

# The Debian package: the programs need Debian's shared libraries (dpkg-shlibdeps finds which),
# Open MPI's launcher, and Python for hpcdata and hpctrain-plot.
set(CPACK_PACKAGE_NAME hpctrain)
set(CPACK_PACKAGE_VENDOR "hpctrain")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "data-parallel trainer, launcher and dataset tool for HPC clusters")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_MAINTAINER "hpctrain maintainers <hpctrain@localhost>")
set(CPACK_DEBIAN_PACKAGE_SECTION science)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_DEPENDS "openmpi-bin, python3")
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "python3-matplotlib, dataset-fashion-mnist, awscli")
set(CPACK_DEBIAN_PACKAGE_SUGGESTS "slurm-wlm")
include(CPack)
