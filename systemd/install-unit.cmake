# Runs at install time (install(CODE) in CMakeLists.txt): writes ckptd.service
# with the paths of this install. ckptd.service in the source tree is the
# unit of a /usr install; here /usr/sbin/ckptd and /usr/share/doc/ckptd become
# the installed ones. CMAKE_INSTALL_PREFIX is the prefix installed to (--prefix).
# In: CKPTD_UNIT_IN, CKPTD_UNIT_OUT, CKPTD_SBINDIR, CKPTD_DOCDIR (relative to
# the prefix unless absolute).
foreach(dir CKPTD_SBINDIR CKPTD_DOCDIR)
  if(NOT IS_ABSOLUTE "${${dir}}")
    set(${dir} "${CMAKE_INSTALL_PREFIX}/${${dir}}")
  endif()
  # systemd wants normalised absolute paths: no //, no trailing /.
  string(REGEX REPLACE "/+" "/" ${dir} "${${dir}}")
  string(REGEX REPLACE "(.)/$" "\\1" ${dir} "${${dir}}")
endforeach()
file(READ "${CKPTD_UNIT_IN}" unit)
string(REPLACE "ExecStart=/usr/sbin/ckptd " "ExecStart=${CKPTD_SBINDIR}/ckptd " unit "${unit}")
string(REPLACE "Documentation=file:///usr/share/doc/ckptd/"
       "Documentation=file://${CKPTD_DOCDIR}/" unit "${unit}")
string(FIND "${unit}" "ExecStart=${CKPTD_SBINDIR}/ckptd " at)
if(at LESS 0)
  message(FATAL_ERROR "${CKPTD_UNIT_IN}: no 'ExecStart=/usr/sbin/ckptd ' line to rewrite")
endif()
file(WRITE "${CKPTD_UNIT_OUT}" "${unit}")
