# Run by cpack (CPACK_PRE_BUILD_SCRIPTS) on the files it is about to pack. The build gives every
# program one RUNPATH, the directories of the libraries it linked from outside the compiler's
# (CMakeLists.txt): Open MPI's /usr/lib/x86_64-linux-gnu/openmpi/lib on Debian, where it is not
# needed, as the loader finds every Debian package's libraries by their sonames without it
# (Debian Policy 10.2; lintian: custom-library-search-path). Entries below /usr/lib and /lib are
# dropped here; others (CUDA's, for hpctrain-cuda) stay; no entry at all, no RUNPATH.
find_program(readelf readelf REQUIRED)
file(GLOB_RECURSE files LIST_DIRECTORIES false "${CPACK_TEMPORARY_INSTALL_DIRECTORY}/*")
foreach(f IN LISTS files)
  if(IS_SYMLINK "${f}")
    continue()
  endif()
  file(READ "${f}" magic LIMIT 4 HEX)
  if(NOT magic STREQUAL "7f454c46")  # not ELF
    continue()
  endif()
  execute_process(COMMAND ${readelf} -d "${f}" OUTPUT_VARIABLE dynamic RESULT_VARIABLE failed)
  if(failed)
    message(FATAL_ERROR "readelf -d ${f} failed")
  endif()
  if(NOT dynamic MATCHES "\\((RUNPATH|RPATH)\\)[^[]*\\[([^]\n]*)\\]")
    continue()
  endif()
  string(REPLACE ":" ";" entries "${CMAKE_MATCH_2}")
  set(kept)
  foreach(entry IN LISTS entries)
    if(NOT entry MATCHES "^/(usr/)?lib(/|$)")
      list(APPEND kept "${entry}")
    endif()
  endforeach()
  if(kept)
    list(JOIN kept ":" kept)
    file(RPATH_SET FILE "${f}" NEW_RPATH "${kept}")
  else()
    file(RPATH_REMOVE FILE "${f}")
  endif()
endforeach()
